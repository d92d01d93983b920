"""One self-contained HTML page (`-f html`): the verdict, plots drawn as inline SVG (svg.py), the findings.

It opens from a CI artifact with no network: no script, no external style or font, and a
Content-Security-Policy that forbids loading anything. Every string of the report is escaped here
(server text is hostile); `kvgate.formats.reporting` has already made controls and bidi characters visible.
A soak report (`cost.soak`) gets its latency, throughput, content-verdict and pool plots; a check
report (`cost.gates`) gets the timeline of its gates: what ran when, how long, what it judged; and
(`cost.steps`) of the steps inside them: each probe, calibration pass and read, when and how long.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from kvgate.formats import svg
from kvgate.formats.base import Formatter
from kvgate.formats.digest import verdict_line
from kvgate.results.findings import Report

#: evidence shown per finding, at most (the json report has all of it)
EVIDENCE_CHARS = 4000

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1b1b;max-width:1100px}
h1{font-size:20px;margin:0 0 8px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{padding:10px 14px;border-radius:6px;font-weight:600;color:#fff;display:inline-block}
.v-passed{background:#2e7d32}.v-failed{background:#c62828}.v-inconclusive{background:#f9a825;color:#000}
.v-error{background:#6a1b9a}
table{border-collapse:collapse;width:100%;margin:6px 0}td,th{border:1px solid #ddd;padding:4px 6px;
vertical-align:top;text-align:left}th{background:#f5f5f5}
.o-passed{color:#2e7d32;font-weight:600}.o-failed{color:#c62828;font-weight:600}
.o-inconclusive{color:#a67c00;font-weight:600}.o-error{color:#6a1b9a;font-weight:600}
svg.plot{display:block;margin:8px 0;background:#fff}svg .grid{stroke:#eee}svg .axisline{stroke:#888}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .title{font-size:13px;font-weight:600}
pre{white-space:pre-wrap;word-break:break-all;background:#fafafa;padding:6px;margin:4px 0}
.note{color:#555}
"""


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _o(outcome: str) -> str:
    return f'<span class="o-{_e(outcome)}">{_e(outcome)}</span>'


def _num(v: Any) -> str:
    return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else _e(v))


class HtmlFormatter(Formatter):
    def render(self, report: Report) -> str:
        status = report.exit_status.name.lower()
        css_class = {"gate_failed": "failed", "transport_error": "error", "internal_error": "error"}.get(status, status)
        parts = [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
            f"<title>kvgate {_e(report.command)}: {_e(status)}</title>",
            f"<style>{CSS}</style></head><body>",
            f"<h1>kvgate {_e(report.command)}</h1>",
            f'<div class="verdict v-{_e(css_class)}">{_e(verdict_line(report))}</div>',
            f'<p class="note">started {_e(report.started_at)}, finished {_e(report.finished_at)}; '
            + ", ".join(f"{_e(k)} {_e(v)}" for k, v in report.target.items() if isinstance(v, (str, int, float)))
            + "</p>",
        ]
        soak = report.cost.get("soak")
        if isinstance(soak, dict):
            parts += _soak(soak)
        gates = report.cost.get("gates")
        if isinstance(gates, list) and gates:
            parts += _gates(gates)
        steps = report.cost.get("steps")
        if isinstance(steps, list) and steps:
            parts += _steps(steps, report.cost.get("steps_dropped"))
        parts += _findings(report)
        if report.notes:
            parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in report.notes) + "</ul>")
        parts.append("</body></html>\n")
        return "\n".join(parts)


def _findings(report: Report) -> list[str]:
    rows = []
    for f in report.findings:
        ev = [
            {"node": e.node, "field": e.field, "value": e.value, "expected": e.expected}
            for e in f.evidence
            if e.field not in ("soak.content", "soak.slo")  # drawn above
        ]
        text = json.dumps(ev, default=str, indent=1)
        if len(text) > EVIDENCE_CHARS:
            text = text[:EVIDENCE_CHARS] + "\n... (cut: the json report has all of it)"
        details = f"<details><summary>evidence</summary><pre>{_e(text)}</pre></details>" if ev else ""
        rows.append(
            f"<tr><td>{_o(f.outcome.value)}</td><td><code>{_e(f.test_id)}</code></td><td>{_e(f.node)}</td>"
            f"<td>{_e(f.summary)}{details}</td><td>{_e(f.remedy or '')}</td></tr>"
        )
    return [
        f"<h2>Findings ({len(report.findings)})</h2>",
        "<table><tr><th>outcome</th><th>check</th><th>node</th><th>summary</th><th>remedy</th></tr>",
        *rows,
        "</table>",
    ]


def _gates(gates: list[Any]) -> list[str]:
    bars = []
    rows = []
    for g in gates:
        if not isinstance(g, dict):
            continue
        name, start, secs = str(g.get("gate", "?")), float(g.get("start_s", 0)), float(g.get("seconds", 0))
        got = g.get("outcomes")
        outcomes: dict[str, Any] = got if isinstance(got, dict) else {}
        worst = next((o for o in ("error", "failed", "inconclusive", "passed") if outcomes.get(o)), "passed")
        bars.append((name, start, secs, worst))
        judged = ", ".join(f"{_e(k)} {_e(v)}" for k, v in outcomes.items() if v)
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{start:.2f}</td><td>{secs:.2f}</td><td>{_o(worst)}</td><td>{judged}</td></tr>"
        )
    return [
        "<h2>What ran when</h2>",
        svg.timeline("gates: start and duration (colour: the worst outcome)", bars),
        "<table><tr><th>gate</th><th>start (s)</th><th>seconds</th><th>worst</th><th>judged</th></tr>",
        *rows,
        "</table>",
    ]


def _steps(steps: list[Any], dropped: object) -> list[str]:
    """Inside the gates: each step (a probe, a read) with its start and duration, as the run recorded it."""
    bars: list[tuple[str, float, float, str]] = []
    rows = []
    for st in steps:
        if not isinstance(st, dict):
            continue
        name, start, secs = str(st.get("step", "?")), float(st.get("start_s", 0)), float(st.get("seconds", 0))
        bars.append((name, start, secs, "ran"))
        rows.append(f"<tr><td>{_e(name)}</td><td>{start:.2f}</td><td>{secs:.2f}</td></tr>")
    more = f'<p class="note">{_e(dropped)} later steps not recorded (the json report counts them)</p>'
    more = more if dropped else ""
    return [
        "<h2>Inside the gates</h2>",
        svg.timeline("steps: start and duration", bars),
        more,
        "<table><tr><th>step</th><th>start (s)</th><th>seconds</th></tr>",
        *rows,
        "</table>",
    ]


_MET = {True: "passed", False: "failed", None: "inconclusive"}


def _levels_table(levels: list[Any]) -> str:
    rows = "".join(
        f"<tr><td>{_e(lv.get('name'))}</td><td>{_bucket(lv)}</td><td>{_num(lv.get('measured'))}</td>"
        f"<td>{_stated(lv)}</td>"
        f"<td>{_o(_MET.get(lv.get('met'), 'inconclusive'))}</td></tr>"
        for lv in levels
        if isinstance(lv, dict)
    )
    head = "<tr><th>level</th><th>bucket</th><th>measured</th><th>stated</th><th>met</th></tr>"
    return f"<table>{head}{rows}</table>"


def _bucket(lv: dict[str, Any]) -> str:
    """A per-bucket level's bucket and prompt length; every request for the others."""
    if lv.get("bucket") is None:
        return "all"
    length = lv.get("length")
    tokens = f" ({length:,} tokens)" if isinstance(length, int) else ""
    return _e(f"{lv['bucket']}{tokens}")


def _stated(lv: dict[str, Any]) -> str:
    """The stated bound: for a per-bucket level, the profile's level plus the bucket's prefill allowance."""
    stated, extra = lv.get("stated"), lv.get("allowance_s")
    if isinstance(stated, (int, float)) and isinstance(extra, (int, float)):
        return f"{_num(stated - extra)} + {_num(extra)} = {_num(stated)}"
    return _num(stated)


def _soak(d: dict[str, Any]) -> list[str]:
    slices = [s for s in d.get("slices", []) if isinstance(s, dict)]
    settings = d.get("settings", {})
    out = ["<h2>Load</h2>", f"<pre>{_e(json.dumps(settings, default=str))}</pre>"]
    if d.get("lengths"):
        out.append(f'<p class="note">prompt lengths by bucket: {_e(json.dumps(d["lengths"]))}</p>')
    run = d.get("run")
    if isinstance(run, dict):
        out += ["<h2>Service levels: the whole run, measured against stated</h2>", _levels_table(run.get("levels", []))]
        prefill = d.get("prefill")
        if isinstance(prefill, dict):
            rate = prefill.get("tokens_per_s")
            said = (
                f"time to first token and end to end: per bucket, the level + {prefill.get('share')} x the "
                f"bucket's tokens / {rate:,.0f} tokens/s of prefill ({prefill.get('source')})"
                if isinstance(rate, (int, float))
                else f"no prefill rate to size the per-bucket levels: {prefill.get('source')}"
            )
            out.append(f'<p class="note">{_e(said)}</p>')
    mid = [((s["start_s"] + s["end_s"]) / 2, s.get("stats", {})) for s in slices]
    lat = [
        (name, [(t, st[key]) for t, st in mid if isinstance(st.get(key), (int, float))])
        for name, key in (
            ("TTFT p50", "ttft_p50_s"),
            ("TTFT p99", "ttft_p99_s"),
            ("ITL p99", "itl_p99_s"),
            ("e2e p50", "e2e_p50_s"),
            ("e2e p99", "e2e_p99_s"),
        )
    ]
    out += ["<h2>Over time</h2>", svg.line_chart("latency percentiles per slice", lat, "seconds", "seconds")]
    bins = [b for b in d.get("bins", []) if isinstance(b, dict)]
    thr = [
        ("requests/s", [(b["t_s"], b["requests"] / b["width_s"]) for b in bins]),
        ("errors/s", [(b["t_s"], b["errors"] / b["width_s"]) for b in bins]),
        ("cancelled/s", [(b["t_s"], b["cancelled"] / b["width_s"]) for b in bins]),
    ]
    out.append(svg.line_chart("throughput and errors", thr, "seconds (request start)", "per second"))
    out.append(
        svg.strip(
            "content verdict per slice",
            [
                (str(s["index"]), str(s.get("verdict", "?")), "; ".join(_content_line(c) for c in s.get("content", [])))
                for s in slices
            ],
            "slice",
        )
    )
    got = d.get("pool")
    pool: dict[str, Any] = got if isinstance(got, dict) else {}
    samples = [p for p in pool.get("samples", []) if isinstance(p, (list, tuple)) and len(p) == 2]
    names = sorted({w for _, got in samples if isinstance(got, dict) for w in got})
    use = [(w, [(t, got[w] * 100) for t, got in samples if w in got]) for w in names]
    out.append(svg.line_chart("workers' KV pool in use (as each reports it)", use, "seconds", "% of the pool"))
    if pool.get("note"):
        out.append(f'<p class="note">{_e(pool["note"])}</p>')
    out += ["<h2>Slices</h2>", "<table><tr><th>slice</th><th>window (s)</th><th>verdict</th><th>content</th>"]
    out.append("<th>requests</th><th>errors</th><th>service levels</th></tr>")
    for s in slices:
        st = s.get("stats", {})
        content = "<br>".join(f"{_o(c.get('outcome', '?'))} {_e(_content_line(c))}" for c in s.get("content", []))
        levels = "<br>".join(
            f"{_e(lv.get('name'))} {_num(lv.get('measured'))} / {_num(lv.get('stated'))}"
            + ("" if lv.get("met") else " (" + ("missed" if lv.get("met") is False else "unmeasured") + ")")
            for lv in s.get("levels", [])
            if isinstance(lv, dict)
        )
        out.append(
            f"<tr><td>{_e(s.get('index'))}</td><td>{_num(s.get('start_s'))}-{_num(s.get('end_s'))}</td>"
            f"<td>{_o(str(s.get('verdict', '?')))}</td><td>{content}</td><td>{_num(st.get('requests'))}</td>"
            f"<td>{_num(st.get('errors'))}</td><td>{levels}</td></tr>"
        )
    out.append("</table>")
    return out


def _content_line(c: Any) -> str:
    if not isinstance(c, dict):
        return str(c)
    return f"{c.get('check')}: {c.get('summary')} (at {c.get('at_s')} s, {c.get('seconds')} s)"
