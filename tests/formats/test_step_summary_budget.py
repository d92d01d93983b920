"""The Markdown report as a GitHub step summary: GitHub drops a summary over 1 MiB whole, so a report
that would render larger is summarized to fit (passed checks counted per check, a finding said alike on
many nodes shown once), never cut inside the verdict: the verdict line, the counts and the deciding
findings always stay whole. Checked on a synthetic 1,024-worker report of the worst shape (every worker
failing with its own text) and on a real 1,024-worker fleet (simulated workers behind the real smg)
through the action's own report step (tools/gha_report.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.formats.digest import verdict_line
from kvgate.formats.markdown import BUDGET_BYTES, MarkdownFormatter
from kvgate.results.findings import Evidence, Finding, Outcome, Report

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 1024 * 1024  # GitHub's step-summary limit
runner = CliRunner()


def _fleet_report(workers: int) -> Report:
    findings: list[Finding] = []
    for i in range(workers):
        node = f"prefill[{i}] http://10.0.{i // 256}.{i % 256}:30000"
        for check in ("reachable", "identity", "role", "dp-ranks", "context-sources", "number"):
            findings.append(Finding("target", check, node, Outcome.PASSED, f"worker {i} answered {check} " + "x" * 60))
        findings.append(
            Finding(
                "pool-context",
                "headroom",
                node,
                Outcome.FAILED,
                f"pool {600_000 + i:,} < 1,310,720 required for context 1,048,576 on worker {i}",
                (Evidence(node, "max_total_num_tokens", 600_000 + i, ">= 1,310,720"),),
                remedy=f"raise the pool of worker {i} (--mem-fraction-static)",
            )
        )
        findings.append(Finding("defenses", "kv-canary", node, Outcome.INFO, f"canary off on worker {i}"))
    return Report(command="check", findings=tuple(findings))


def test_a_1024_worker_report_is_summarized_under_the_limit_with_its_verdict_whole() -> None:
    report = _fleet_report(1024)
    text = MarkdownFormatter().render(report)
    assert len(text.encode()) <= BUDGET_BYTES < LIMIT
    assert text.startswith(f"## {verdict_line(report)}\n")
    assert "Summarized to fit GitHub's 1 MiB step-summary limit" in text
    assert "pool-context.headroom" in text.split("|", 1)[0]  # the deciding finding leads, before any table
    tokens = MarkdownIt("commonmark").enable("table").parse(text)  # as GitHub renders the summary
    assert [t.tag for t in tokens if t.type == "heading_open"][0] == "h2"
    assert any(t.type == "table_open" for t in tokens)
    # Below the limit nothing changes: every finding is its own row.
    small = _fleet_report(4)
    full = MarkdownFormatter().render(small)
    assert "Summarized" not in full and full.count("\n| ") == 2 + len(small.findings)


def test_a_real_1024_worker_fleet_summary_stays_under_githubs_limit(
    deployment: Callable[..., Any], tmp_path: Path
) -> None:
    dep = deployment(
        emulate="0.5.22",
        prefill=512,
        decode=512,
        context_length=4096,
        prefill_pool=4096,  # below 1.25 x the context on every prefill: 512 failures with their own text
        decode_pool=8192,
        light=True,
        ready_deadline_s=600.0,
    )
    md, js = tmp_path / "report.md", tmp_path / "report.json"
    res = runner.invoke(
        app,
        ["check", "--quiet", "--router-url", str(dep.router_url), "--no-probes", "--read-deadline", "300"]
        + ["--timeout", "60", "-f", "markdown", "-o", str(md), "-f", "json", "-o", str(js)],
    )
    assert res.exit_code == 1, res.output
    doc = json.loads(js.read_text())
    assert len(doc["target"]["nodes"]) == 1024
    summary = tmp_path / "step-summary.md"
    summary.write_text("")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gha_report.py"), str(js), str(md)],
        env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    text = summary.read_text()
    assert 0 < len(text.encode()) < LIMIT, len(text.encode())
    assert "Summarized to fit GitHub's 1 MiB step-summary limit" in text  # the whole table would not fit
    assert text.startswith("## kvgate check: GATE FAILED"), text[:200]
    assert "pool-context.headroom" in text
