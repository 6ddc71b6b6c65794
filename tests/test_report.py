from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from attune.app import report
from attune.control.campaign import start
from attune.core.ledger import Ledger
from attune.core.measure import payback_days
from tests.conftest import run_cli

CALIB = [1000.0, 1010.0, 990.0, 1005.0, 995.0]


def _campaign(campaign_dir: Path) -> Path:
    start(campaign_dir)
    led = Ledger(campaign_dir)
    led.append("budget_set", {"gpu_hours": 2.0, "reserve_gpu_hours": 0.1, "reason": "30 x baseline run"})
    for i, v in enumerate(CALIB):
        rid = f"cal-{i}"
        led.append("launch_admitted", {"run_id": rid, "kind": "calibration", "expected_gpu_hours": 0.01})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 0.01})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": v, "valid": True})
        led.append("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": v})
    searches = [
        ("s1", "microbatch", {"args": {"--micro-batch-size": 4}}, "ok", 1200.0, "leader"),
        ("s2", "recompute", {"args": {"--recompute-granularity": "full"}}, "ok", 900.0, "slower"),
        ("s3", "threads", {"env": {"OMP_NUM_THREADS": "8"}}, "oom", None, "failed"),
        ("s4", "optimizer", {"args": {"--optimizer-impl": "foreach"}}, "ok", 1400.0, "leader"),
    ]
    for rid, lever, changes, outcome, tps, verdict in searches:
        led.append("launch_admitted", {"run_id": rid, "kind": "search", "expected_gpu_hours": 0.02, "lever": lever,
                                       "changes": changes, "hypothesis": f"{lever} shrinks the step"})
        led.append("run_finished", {"run_id": rid, "outcome": outcome, "charge_gpu_hours": 0.02})
        if tps is not None:
            led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": tps, "valid": True, "verdict": verdict})
            if verdict == "leader":
                led.append("leader_changed", {"run_id": rid, "tokens_per_s_per_gpu": tps})
    led.append("stop_recorded", {"leader": "s4", "levers_tested": ["microbatch", "recompute", "threads", "optimizer"],
                                 "diagnosis": "host-bound; nothing left above the band"})
    led.append("launch_admitted", {"run_id": "chk-s4", "kind": "check", "expected_gpu_hours": 0.03})
    led.append("run_finished", {"run_id": "chk-s4", "outcome": "ok", "charge_gpu_hours": 0.03})
    led.append("check_run", {"run_id": "chk-s4", "candidate_run_id": "s4", "passed": True,
                             "layer1": "ok", "correlation": 0.999})
    led.append("shipped", {"run_id": "s4", "recipe": {}, "changes": {"args": {"--optimizer-impl": "foreach"}}})
    for rid, of, v in [("re-b1", "baseline", 1000.0), ("re-s1", "s4", 1390.0), ("re-b2", "baseline", 1004.0),
                       ("re-s2", "s4", 1402.0)]:
        led.append("remeasurement", {"run_id": rid, "recipe_of": of, "tokens_per_s_per_gpu": v})
    return campaign_dir


def test_headline_numbers(campaign_dir: Path) -> None:
    r = report.build(_campaign(campaign_dir))
    h = r.headline
    assert h.remeasured and h.baseline_tps == pytest.approx(1002.0) and h.shipped_tps == pytest.approx(1396.0)
    assert h.gain == pytest.approx(1396.0 / 1002.0 - 1)
    assert h.launches == 4 and h.failed_launches == 1 and h.failed_gpu_hours == pytest.approx(0.02)
    used = 5 * 0.01 + 4 * 0.02 + 0.03
    assert h.gpu_hours_used == pytest.approx(used)
    assert h.payback_days == pytest.approx(payback_days(used, 2, h.gain))
    # price 0.05 per rank-hour in the example spec
    assert h.shipped_cost_per_mtok == pytest.approx(0.05 / (1396.0 * 3600) * 1e6)
    assert h.shipped_mfu is None  # a CPU has no known peak
    # The curve is a non-decreasing best-so-far, ending at the last leader's gain over the calibration mean.
    ys = [y for _, y in r.curve]
    assert ys == sorted(ys) and ys[-1] == pytest.approx(1400.0 / 1000.0 - 1)
    assert [p[2] for p in r.leader_points] == ["s1", "s4"]


def test_report_cli_writes_markdown_and_html(campaign_dir: Path) -> None:
    _campaign(campaign_dir)
    res = run_cli("report", str(campaign_dir), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["headline"]["shipped_run_id"] == "s4"
    md = (campaign_dir / "report.md").read_text()
    assert "optimizer shrinks the step" in md and "--optimizer-impl=foreach" in md and "+39.3%" in md
    page = (campaign_dir / "report.html").read_text()
    assert "<svg" in page and 'id="runs"' in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG with the standard library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        ctype, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if ctype == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            bpp = 3 if color == 2 else 4
        elif ctype == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 255
            elif ftype == 2:
                line[x] = (line[x] + b) & 255
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, bpp, rows


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (.ci/run installs it)")
def test_html_renders_in_real_headless_chromium(campaign_dir: Path, tmp_path: Path) -> None:
    _campaign(campaign_dir)
    _, page, _ = report.write(campaign_dir)
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'id="gain-curve"' in dom.stdout and "<table" in dom.stdout and "s4" in dom.stdout
    shot = tmp_path / "shot.png"
    res = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1200,1400", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    width, bpp, rows = _png_pixels(shot.read_bytes())
    blue = sum(
        1 for row in rows for x in range(0, len(row), bpp)
        if abs(row[x] - 0x1F) < 30 and abs(row[x + 1] - 0x77) < 30 and abs(row[x + 2] - 0xB4) < 30
    )
    grey_borders = sum(1 for row in rows for x in range(0, len(row), bpp) if row[x] == row[x + 1] == row[x + 2] == 0xCC)
    assert blue > 200, f"the plot's curve did not render ({blue} curve-coloured pixels)"
    assert grey_borders > 500, "the tables' borders did not render"


HOSTILE = '<script>alert(1)</script>"\' onmouseover="x" <a href="javascript:alert(2)">j</a>'


def test_hostile_ledger_text_is_escaped_in_the_page(campaign_dir: Path) -> None:
    """Agent-written fields (lever, hypothesis, changes, diagnosis, shipped and check ids) reach the page
    through Jinja2's autoescaping: no tag, attribute or javascript: link survives as markup."""
    _campaign(campaign_dir)
    led = Ledger(campaign_dir)
    led.append("launch_admitted", {"run_id": "s9", "kind": "search", "expected_gpu_hours": 0.02, "lever": HOSTILE,
                                   "changes": {"env": {"NCCL_ALGO": HOSTILE}}, "hypothesis": HOSTILE})
    led.append("run_finished", {"run_id": "s9", "outcome": "crash", "charge_gpu_hours": 0.02})
    led.append("check_run", {"run_id": "chk-x", "candidate_run_id": HOSTILE, "passed": False, "layer1": HOSTILE})
    page = report.to_html(report.build(campaign_dir))
    assert "<script>" not in page and "<a href" not in page and 'onmouseover="x"' not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and ("&#34;" in page or "&quot;" in page)
    assert page.count("<tr>") >= 5 and "attune campaign report" in page  # the page itself still renders


def test_gpu_hour_axis_labels_are_plain_numbers_inside_the_picture() -> None:
    """A campaign of hundreds or thousands of GPU-hours gets labels like 1,410, never 1.41e+03, and the
    last label ends at the axis' end (a centred one was cut by the picture's edge)."""
    import re

    from attune.app.report import _axis_number, svg_plot

    assert [_axis_number(v) for v in (0, 470, 1410.4, 1880, 0.0123, 12.5)] == [
        "0", "470", "1,410", "1,880", "0.0123", "12.5"]
    r = SimpleNamespace(curve=[(0.0, 0.0), (700.0, 0.05), (1336.0, 0.19), (1880.0, 0.19)],
                        leader_points=[(700.0, 0.05, "r012"), (1336.0, 0.19, "r022")],
                        headline=SimpleNamespace(band=0.0325))
    svg = svg_plot(r)
    labels = re.findall(r'text-anchor="(\w+)" font-size="11">([^<]+)</text>', svg)
    assert not any("e+" in t for _, t in labels), labels
    assert ("end", "1,880") in labels
