"""A FAKE Kubernetes API server for the Kubernetes executor's tests: no kube-apiserver can be installed here
(no Debian or PyPI package ships one), so this serves, on localhost over HTTP, the few REST paths the
official `kubernetes` client uses for a TrainJob custom object and its pods, with the API server's own
status codes and object shapes:

    POST/GET/LIST/DELETE  /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs[/{name}]
    PATCH                 /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status
    POST/GET/LIST         /api/v1/namespaces/{ns}/pods[/{name}]      (labelSelector k=v[,k=v])
    PATCH                 /api/v1/namespaces/{ns}/pods/{name}/status
    GET                   /api/v1/namespaces/{ns}/pods/{name}/log    (text/plain)

409 on a name that exists, 404 on one that does not, a metav1 Status body for errors, merge-patch for
PATCH, creationTimestamp/uid/resourceVersion set on create, and deleting a TrainJob deletes the pods of its
JobSet (label jobset.sigs.k8s.io/jobset-name), as the Trainer and JobSet controllers do. `fieldValidation=
Strict` is accepted; unknown fields are not judged here (the executor checks them against the Trainer
API's models before it sends).

What the controllers do (Kueue admitting, JobSet creating pods, the kubelet running them) the test does
itself, through the same REST API, with the `kubernetes` client: `FakeCluster` holds the helpers.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

GROUP_PATH = re.compile(
    r"^/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/(?P<ns>[^/]+)/trainjobs(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
)
POD_PATH = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|log))?$"
)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(dst: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch (what `application/merge-patch+json` means)."""
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = v
    return dst


def selected(obj: dict, selector: str | None) -> bool:
    if not selector:
        return True
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        k, _, v = term.partition("=")
        if labels.get(k.strip()) != v.strip():
            return False
    return True


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trainjobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    state: _State

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(
            code,
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
             "reason": reason, "code": code},
        )  # fmt: skip

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.state.lock:
            self.state.requests.append((method, self.path))
        m = GROUP_PATH.match(url.path)
        if m:
            return self._objects(method, self.state.trainjobs, "TrainJob", m, q)
        m = POD_PATH.match(url.path)
        if m:
            if m["sub"] == "log" and method == "GET":
                with self.state.lock:
                    if (m["ns"], m["name"]) not in self.state.pods:
                        return self._status(404, "NotFound", f'pods "{m["name"]}" not found')
                    text = self.state.logs.get((m["ns"], m["name"]), "")
                return self._send(200, text, "text/plain")
            return self._objects(method, self.state.pods, "Pod", m, q)
        return self._status(404, "NotFound", f"the server could not find the requested resource {url.path}")

    def _objects(self, method: str, store: dict, kind: str, m, q: dict) -> None:
        ns, name = m["ns"], m["name"]
        plural = "trainjobs" if kind == "TrainJob" else "pods"
        with self.state.lock:
            if method == "POST" and name is None:
                obj = self._body()
                meta = obj.setdefault("metadata", {})
                meta.setdefault("namespace", ns)
                key = (ns, meta.get("name"))
                if key in store:
                    return self._status(409, "AlreadyExists", f'{plural} "{key[1]}" already exists')
                meta.update(creationTimestamp=now(), uid=str(uuid.uuid4()), resourceVersion="1")
                store[key] = obj
                return self._send(201, obj)
            if method == "GET" and name is None:
                items = [o for (n, _), o in store.items() if n == ns and selected(o, q.get("labelSelector"))]
                return self._send(
                    200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items}
                )
            key = (ns, name)
            if key not in store:
                return self._status(404, "NotFound", f'{plural} "{name}" not found')
            obj = store[key]
            if method == "GET":
                return self._send(200, obj)
            if method == "PATCH":
                merge(obj, self._body())
                obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
                return self._send(200, obj)
            if method == "DELETE":
                del store[key]
                if kind == "TrainJob":  # the Trainer deletes its JobSet, JobSet its pods
                    for pk in [k for k, p in self.state.pods.items() if k[0] == ns and selected(
                        p, f"jobset.sigs.k8s.io/jobset-name={name}")]:  # fmt: skip
                        del self.state.pods[pk]
                return self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        return self._status(405, "MethodNotAllowed", f"{method} is not supported here")

    def do_GET(self) -> None:  # noqa: N802
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._route("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")


class FakeApiServer:
    """The fake API server on 127.0.0.1 (a free port), in a thread of the test process."""

    def __init__(self) -> None:
        self.state = _State()
        handler = type("Handler", (_Handler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def kubeconfig(self, path: Path, context: str = "fake", namespace: str = "default") -> Path:
        """A kubeconfig whose context `context` points at this server, as on a real cluster."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [
                {"name": context, "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}
            ],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def set_log(self, ns: str, pod: str, text: str) -> None:
        with self.state.lock:
            self.state.logs[(ns, pod)] = text
