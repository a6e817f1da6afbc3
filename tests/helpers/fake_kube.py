"""A FAKE Kubernetes API server for the Kubernetes executor's tests: no kube-apiserver can be installed here
(no Debian or PyPI package ships one), so this serves, on localhost over HTTP, the few REST paths the
official `kubernetes` client and `kubectl` use for the TrainJob custom object, the Kueue Workload that
gates it, and its pods, with the API server's own status codes and object shapes:

    POST/GET/LIST/DELETE  /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs[/{name}]
    PATCH                 /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status
    POST/GET/LIST/DELETE  /apis/kueue.x-k8s.io/{kueue version}/namespaces/{ns}/workloads[/{name}]
    PATCH                 /apis/kueue.x-k8s.io/{kueue version}/namespaces/{ns}/workloads/{name}/status
    POST/GET/LIST         /api/v1/namespaces/{ns}/pods[/{name}]      (labelSelector k=v[,k=v])
    PATCH                 /api/v1/namespaces/{ns}/pods/{name}/status
    GET                   /api/v1/namespaces/{ns}/pods/{name}/log    (text/plain)

and the discovery documents `kubectl` reads to map `trainjobs` and `pods` onto those paths (`/version`,
`/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`, in the shapes of the API server's unaggregated
discovery: APIVersions, APIGroupList, APIResourceList). A group version it does not serve is a 404, as on
a cluster without that controller. No OpenAPI document is served: `kubectl apply --validate=false` skips
the client-side schema check that would download it.

409 on a name that exists, 404 on one that does not, a metav1 Status body for errors, merge-patch for
PATCH, creationTimestamp/uid/resourceVersion set on create, and deleting a TrainJob deletes the pods of its
JobSet (label jobset.sigs.k8s.io/jobset-name), as the Trainer and JobSet controllers do. `fieldValidation=
Strict` is accepted; unknown fields are not judged here (the executor checks them against the Trainer
API's models before it sends).

What the controllers do (Kueue admitting, JobSet creating pods, the kubelet running them) the test does
itself, through the same REST API, with the `kubernetes` client: `FakeCluster` holds what the tests share.
What only time does (an object's creationTimestamp, read-only through the API) `FakeApiServer.backdate`
does.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

GROUP_PATH = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
)
POD_PATH = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|log))?$"
)
TRAINER = ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob", "trainjob")
KUEUE_GROUP = "kueue.x-k8s.io"
_VERBS = ["create", "delete", "get", "list", "patch", "update"]


def _resource(name: str, kind: str, singular: str = "", verbs=_VERBS) -> dict:
    return {"name": name, "singularName": singular, "namespaced": True, "kind": kind, "verbs": list(verbs)}


def discovery(custom: list[tuple[str, str, str, str, str]]) -> dict[str, dict]:
    """The discovery documents of a server holding pods and these custom resources (k8s.io/apimachinery
    pkg/apis/meta/v1 types.go: APIVersions, APIGroupList, APIResourceList)."""
    docs = {
        "/version": {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"},
        "/api": {"kind": "APIVersions", "versions": ["v1"],
                 "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
             "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v, *_ in custom]},
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            _resource("pods", "Pod", "pod"), _resource("pods/status", "Pod", verbs=["get", "patch"]),
            _resource("pods/log", "Pod", verbs=["get"])]},
    }  # fmt: skip
    for g, v, plural, kind, singular in custom:
        docs[f"/apis/{g}/{v}"] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{g}/{v}",
            "resources": [
                _resource(plural, kind, singular),
                _resource(f"{plural}/status", kind, verbs=["get", "patch"]),
            ],
        }
    return docs


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
        self.custom: dict[tuple[str, str, str], str] = {}  # (group, version, plural) -> kind
        self.discovery: dict[str, dict] = {}
        self.objects: dict[str, dict[tuple[str, str], dict]] = {}  # plural -> (namespace, name) -> object
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
        if method == "GET" and url.path.rstrip("/") in self.state.discovery:
            return self._send(200, self.state.discovery[url.path.rstrip("/")])
        m = GROUP_PATH.match(url.path)
        kind = m and self.state.custom.get((m["group"], m["version"], m["plural"]))
        if kind:
            return self._objects(method, self.state.objects[m["plural"]], kind, m, q)
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
        plural = m["plural"] if "plural" in m.groupdict() else "pods"
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
                if kind == "TrainJob":  # the Trainer deletes its JobSet, JobSet its pods; the garbage
                    # collector the Workload Kueue made for it (its owner reference)
                    for pk in [k for k, p in self.state.pods.items() if k[0] == ns and selected(
                        p, f"jobset.sigs.k8s.io/jobset-name={name}")]:  # fmt: skip
                        del self.state.pods[pk]
                    workloads = self.state.objects.get("workloads", {})
                    for wk in [k for k, w in workloads.items() if k[0] == ns and selected(
                        w, f"kueue.x-k8s.io/job-uid={obj['metadata']['uid']}")]:  # fmt: skip
                        del workloads[wk]
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
    """The fake API server on 127.0.0.1 (a free port), in a thread of the test process. `kueue`: the
    version of Kueue's API it serves (None: a cluster without Kueue)."""

    def __init__(self, kueue: str | None = "v1beta2") -> None:
        self.state = _State()
        custom = [TRAINER] + ([(KUEUE_GROUP, kueue, "workloads", "Workload", "workload")] if kueue else [])
        self.state.custom = {(g, v, plural): kind for g, v, plural, kind, _ in custom}
        self.state.objects = {plural: {} for _, _, plural, _, _ in custom}
        self.state.discovery = discovery(custom)
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

    def backdate(self, plural: str, ns: str, name: str, seconds: float) -> None:
        """Make the object `seconds` older: what time does to its creationTimestamp."""
        with self.state.lock:
            meta = self.state.objects[plural][(ns, name)]["metadata"]
            created = datetime.fromisoformat(meta["creationTimestamp"].replace("Z", "+00:00"))
            meta["creationTimestamp"] = (created - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def set_log(self, ns: str, pod: str, text: str) -> None:
        with self.state.lock:
            self.state.logs[(ns, pod)] = text


# The Trainer's message for a TrainJob that is suspended (Kubeflow Trainer pkg/constants), and Kueue's for a
# Workload that does not fit (sigs.k8s.io/kueue pkg/scheduler/flavorassigner) and one it evicted to make room
# for a higher priority (pkg/workload)
TRAINJOB_SUSPENDED = "TrainJob is suspended"
KUEUE_NO_QUOTA = (
    "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default-flavor, "
    "2 more needed"
)
KUEUE_PREEMPTED = "Preempted to accommodate a higher priority Workload"


class FakeCluster:
    """What the controllers do to a TrainJob (the Trainer's conditions, Kueue's Workload), done by a test
    through the REST API with the official client, in namespace `ns`."""

    def __init__(self, kubeconfig: Path, ns: str, kueue: str | None = "v1beta2") -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(kubeconfig), context="fake")
        self.co, self.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        self.ns, self.kueue = ns, kueue

    def _tj(self, name: str) -> dict:
        g, v, plural, *_ = TRAINER
        return self.co.get_namespaced_custom_object(g, v, self.ns, plural, name)

    def trainjobs(self) -> dict[str, dict]:
        g, v, plural, *_ = TRAINER
        return {
            t["metadata"]["name"]: t
            for t in self.co.list_namespaced_custom_object(g, v, self.ns, plural)["items"]
        }

    def condition(self, tj: str, kind: str, status: str, reason: str, message: str = "") -> None:
        """Set the TrainJob's condition `kind` (replacing one of that type), as its controller does."""
        g, v, plural, *_ = TRAINER
        cond = {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now(),
        }
        old = [c for c in (self._tj(tj).get("status") or {}).get("conditions") or [] if c["type"] != kind]
        self.co.patch_namespaced_custom_object_status(
            g, v, self.ns, plural, tj, {"status": {"conditions": [*old, cond]}}
        )

    def suspend(self, tj: str) -> None:
        """The Trainer's condition for a TrainJob Kueue holds (spec.suspend)."""
        self.condition(tj, "Suspended", "True", "Suspended", TRAINJOB_SUSPENDED)

    def workload(self, tj: str, conditions: list[dict]) -> None:
        """Kueue's Workload for the TrainJob (labelled with its uid, owned by it), with these conditions."""
        g, v, *_ = TRAINER
        uid = self._tj(tj)["metadata"]["uid"]
        name = f"trainjob-{tj}-3f9a1"
        self.co.create_namespaced_custom_object(KUEUE_GROUP, self.kueue, self.ns, "workloads", {
            "apiVersion": f"{KUEUE_GROUP}/{self.kueue}", "kind": "Workload",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/job-uid": uid}, "ownerReferences": [
                {"apiVersion": f"{g}/{v}", "kind": "TrainJob", "name": tj, "uid": uid, "controller": True}]},
            "spec": {"queueName": "team-a"},
        })  # fmt: skip
        stamped = [dict(c, lastTransitionTime=now()) for c in conditions]
        self.co.patch_namespaced_custom_object_status(
            KUEUE_GROUP, self.kueue, self.ns, "workloads", name, {"status": {"conditions": stamped}}
        )
