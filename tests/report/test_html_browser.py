"""The HTML report rendered by a real headless Chromium; the screenshot must show the four plots."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.scaling_store import build_store  # noqa: E402
from mimo_jobs.report import (
    build,  # noqa: E402
    render,
)
from mimo_jobs.report.svg import IDEAL, PALETTE  # noqa: E402

pytestmark = pytest.mark.browser


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not exe:
        pytest.skip("headless chromium not installed (tests/run.sh installs the Debian package `chromium`)")
    return exe


def screenshot(html: Path, out: Path, tmp: Path, size=(1200, 1000)) -> Path:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--hide-scrollbars",
        f"--screenshot={out}",
        f"--window-size={size[0]},{size[1]}",
        html.resolve().as_uri(),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.is_file(), f"chromium wrote no screenshot (rc {res.returncode}): {res.stderr[-2000:]}"
    return out


def _rgb(hex_: str) -> tuple[int, int, int]:
    return tuple(int(hex_[i : i + 2], 16) for i in (1, 3, 5))


def analyse(png: Path) -> dict:
    """Pixels of each plot colour (within a small tolerance), split by page half, and how much of the
    top of the page is not white."""
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(png).convert("RGB")).astype(np.int32)
    h, w, _ = img.shape
    out = {}
    for name, hex_ in (("blue", PALETTE[0]), ("red", PALETTE[1]), ("green", PALETTE[2]), ("ideal", IDEAL)):
        mask = np.abs(img - np.array(_rgb(hex_))).sum(axis=2) <= 30
        ys, xs = np.nonzero(mask)
        out[name] = {
            "left": int((xs < w // 2).sum()),
            "right": int((xs >= w // 2).sum()),
            "ymin": int(ys.min()) if ys.size else None,
            "ymax": int(ys.max()) if ys.size else None,
        }
    out["non_white"] = float((img[:800].sum(axis=2) < 720).mean())
    return out


def test_html_report_plots_render_in_chromium(tmp_path):
    con, _ = build_store(tmp_path)
    rep = build(con, "scal")
    con.close()
    html = render(rep, "html", tmp_path / "report")
    a = analyse(screenshot(html, tmp_path / "shot.png", tmp_path))
    # top row: iteration time (left) and per-GPU throughput (right), each with a measured series (blue)
    # and a dashed ideal line (dark gold); bottom row: loss curves (left: blue/red/green per run) and the phase
    # breakdown (right: stacked bars in the same palette)
    for colour in ("blue", "red", "green", "ideal"):
        assert a[colour]["left"] > 80 and a[colour]["right"] > 80, (colour, a)
    assert a["red"]["ymin"] > a["ideal"]["ymin"] + 150, a  # loss/phase plots sit below the scaling plots
    assert a["non_white"] > 0.03, a

    # Control: the same page without its plots fails the same checks (the check can fail).
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<svg.*?</svg>", "", html.read_text(), flags=re.S))
    b = analyse(screenshot(bare, tmp_path / "bare.png", tmp_path))
    assert all(b[c]["left"] + b[c]["right"] == 0 for c in ("blue", "red", "green", "ideal")), b


def test_single_node_study_html_shows_layout_bars_and_no_scaling_claim(tmp_path):
    from helpers.pair_store import DP2, HET, TP2, build_report

    rep = build_report(tmp_path / "store", {HET: 100.0, TP2: 282.0, DP2: 86.0})
    html = render(rep, "html", tmp_path / "report")
    head = html.read_text().split("<h2>", 1)[0]
    # one node count: layouts of one size, compared by throughput; no baseline N0 and no E(N)
    assert "layouts of one size" in head and "E(N)" not in head and "strong scaling" not in head
    a = analyse(screenshot(html, tmp_path / "shot.png", tmp_path, size=(1200, 1400)))
    # bars (blue) in both plot columns: time and throughput per layout, then the pair bars below
    assert a["blue"]["left"] > 80 and a["blue"]["right"] > 80, a
    assert a["ideal"]["left"] + a["ideal"]["right"] == 0, a  # no ideal scaling line for one node count


def test_three_node_count_study_html_announces_its_scaling(tmp_path):
    con, _ = build_store(tmp_path)
    rep = build(con, "scal")
    con.close()
    assert len({r.nodes for r in rep.runs}) == 3
    html = render(rep, "html", tmp_path / "report")
    head = html.read_text().split("<h2>", 1)[0]
    assert "strong scaling, baseline N0=1 nodes" in head and "E(N) = P(N)/P(N0)" in head
    a = analyse(screenshot(html, tmp_path / "shot.png", tmp_path))
    assert a["ideal"]["left"] > 80 and a["ideal"]["right"] > 80, a
