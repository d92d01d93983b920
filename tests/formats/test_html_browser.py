"""The html reports (`-f html`) opened in a real headless browser engine: Debian's chromium driven by
Playwright's Python API (its own browser download is not used). A real soak's report and a real check's
load with no console message and no request leaving the page, and their plots render with data points;
hostile server text stays text. Skipped only where the chromium binary is missing (.ci/run installs it)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.formats.html import HtmlFormatter
from kvgate.results.findings import Evidence, Report, failed
from tests.soak.helpers import soak

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")

HOSTILE = "<script>console.error('pwned')</script><img src=x onerror=\"console.error('img')\">&amp;\u202e"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser: Any, path: Path) -> tuple[Any, list[str], list[str]]:
    """The loaded page, every console message and every request other than the file itself."""
    page = browser.new_page()
    messages: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    page.on("request", lambda r: requests.append(r.url) if r.url != path.as_uri() else None)
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, messages, requests


def plot_points(page: Any, title: str) -> int:
    """Data points (circles) of the plot with this title."""
    return int(page.locator(f'svg.plot[aria-label="{title}"] circle').count())


def test_a_soak_report_loads_cleanly_and_its_plots_have_data_points(
    browser: Any, deployment: Callable[..., Any], tmp_path: Path
) -> None:
    dep = deployment(emulate="0.5.23", context_length=4096, prefill_pool=16384, decode_pool=16384, page_size=16)
    code, _doc, html, out = soak(dep.router_url, tmp_path, "--duration", "4")
    assert code == 0, out
    page, messages, requests = open_page(browser, html)
    try:
        assert messages == [] and requests == []
        assert plot_points(page, "latency percentiles per slice") >= 2 * 4  # 2 slices x at least 4 levels
        assert plot_points(page, "throughput and errors") >= 3
        assert plot_points(page, "workers' KV pool in use (as each reports it)") >= 2
        cells = page.locator('svg.plot[aria-label="content verdict per slice"] rect.cell.passed')
        assert cells.count() == 2
        # the drawn plot really has an area in the layout (not a hidden or zero-size element)
        box = page.locator('svg.plot[aria-label="latency percentiles per slice"]').bounding_box()
        assert box is not None and box["width"] > 100 and box["height"] > 100
        assert "PASSED" in page.locator(".verdict").inner_text()
    finally:
        page.close()


def test_a_check_report_shows_what_ran_when(browser: Any, deployment: Callable[..., Any], tmp_path: Path) -> None:
    dep = deployment(emulate="0.5.23", context_length=4096, prefill_pool=16384, decode_pool=16384, page_size=16)
    html = tmp_path / "check.html"
    res = CliRunner().invoke(
        app, ["check", "--router-url", dep.router_url, "--no-probes", "--no-strict", "-f", "html", "-o", str(html)]
    )
    assert html.is_file(), res.output
    page, messages, requests = open_page(browser, html)
    try:
        assert messages == [] and requests == []
        bars = page.locator('svg.plot[aria-label^="gates: start and duration"] rect.bar')
        assert bars.count() >= 2  # every gate that ran, as a bar
        steps = page.locator('svg.plot[aria-label^="steps: start and duration"] rect.bar')
        assert steps.count() >= 1  # inside the gates: at least the workers' metadata read
        assert "reading metadata of" in page.locator("body").inner_text()
        assert page.locator("table tr").count() > 3
    finally:
        page.close()


def test_hostile_server_text_stays_text(browser: Any, tmp_path: Path) -> None:
    soak_data = {
        "settings": {"duration_s": 4},
        "slices": [
            {
                "index": 1,
                "start_s": 0,
                "end_s": 2,
                "verdict": "failed",
                "stats": {"ttft_p50_s": 0.1, "requests": 3},
                "levels": [{"name": HOSTILE, "measured": 1.0, "stated": 2.0, "met": True}],
                "content": [{"check": "canary", "outcome": "failed", "summary": HOSTILE, "at_s": 2, "seconds": 0}],
            }
        ],
        "run": {
            "levels": [
                {"name": HOSTILE, "bucket": HOSTILE, "length": 16, "measured": 1.0, "stated": 3.0, "allowance_s": 1.0},
            ]
        },
        "prefill": {"tokens_per_s": 100.0, "share": 9, "source": HOSTILE},
        "bins": [{"t_s": 0, "width_s": 1, "requests": 3, "errors": 0, "cancelled": 0}],
        "pool": {"samples": [[0.5, {HOSTILE: 0.25}], [1.5, {HOSTILE: 0.5}]], "problems": {}, "note": HOSTILE},
    }
    report = Report(
        command="soak",
        findings=(failed("soak", "content", HOSTILE, HOSTILE, Evidence(HOSTILE, "x", HOSTILE)),),
        cost={"soak": soak_data},
        target={"router_url": HOSTILE},
    )
    path = tmp_path / "hostile.html"
    path.write_text(HtmlFormatter().render(report), encoding="utf-8")
    page, messages, requests = open_page(browser, path)
    try:
        assert messages == [] and requests == []
        assert page.locator("script").count() == 0 and page.locator("img").count() == 0
        text = page.locator("body").inner_text()
        assert "<script>console.error('pwned')</script>" in text
        assert f"{HOSTILE} (16 tokens)" in text and "2 + 1 = 3" in text  # a per-bucket level: level + allowance
        assert plot_points(page, "workers' KV pool in use (as each reports it)") == 2
    finally:
        page.close()
