"""Server text is data in every sink (kvgate/output/sinks.py), proven with each sink's own parser over
arbitrary Unicode.

For each sink a report (or a metric, or an annotation) carries hypothesis-drawn server text where a
server's text goes (a node name, a summary, an evidence value); the output is rendered through the
real output boundary (`reporting.emit`, `tools/gha_report.py`, the watch's metrics) and parsed:

- terminal / step output: no C0/C1 control, bidi override or separator besides kvgate's own line
  breaks; the GitHub runner's parser (`workflow_commands`, written from its documented rules) finds
  no command in it; the text is there (with its hidden characters as visible escapes);
- Markdown: markdown-it (CommonMark with GFM tables and strikethrough) gives the same block and inline
  structure as for harmless text, and the text shows;
- XML (JUnit): expat parses it; the same elements as for harmless text; the attribute shows the text;
- workflow commands: one command per annotation line, its title and message unescape to the text;
- Prometheus: prometheus_client's parser gives one series per (check, node), the label shows the text.

And the redaction of the forms kvgate derives from a secret: no 8-character fragment of the token,
as is, case-folded or percent-encoded, survives in any format.
"""

from __future__ import annotations

import io
import os
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from kvgate.formats import ReportFormat
from kvgate.formats.reporting import emit
from kvgate.output import redact as R
from kvgate.output import sinks
from kvgate.results.findings import Evidence, Finding, Outcome, Report

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "150"))
# Arbitrary Unicode, surrogates included (a server's JSON can carry "\ud800"), weighted toward the
# characters sinks act on.
_SPECIAL = list("\r\n\t\x00\x1b\x07\x7f\x85\x9b\u202e\u2066\u2028\ufeff\ufffe<>&|`*_[]#:%,=-!$~\\\"'") + [
    "::",
    "##[",
    "<!--",
    "\r\n::error::x",
    "\n::add-mask::y",
    "::stop-commands::z",
    "<KVGM3LND4CJAC>",
    "1. ",
    "# ",
    "    ",
]
server_text = st.lists(
    st.one_of(st.text(max_size=12), st.sampled_from(_SPECIAL), st.characters(min_codepoint=0, max_codepoint=0x10FFFF)),
    max_size=12,
).map("".join)

_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NET_SPACE = sinks._NET_SPACE


def _settings(n: int = EXAMPLES) -> Any:
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    with R.scope():
        yield


def _report(text: str) -> Report:
    """A report with `text` wherever a server's text goes."""
    return Report(
        command="check",
        findings=(
            Finding(
                "defenses",
                "release",
                f"prefill[0] {text}",
                Outcome.FAILED,
                f"version {text} is too old",
                (Evidence(f"prefill[0] {text}", "version", text, ">= 0.5.21"),),
                remedy="upgrade",
            ),
            Finding("fleet", "listed", text, Outcome.INCONCLUSIVE, text),
        ),
        notes=(text,),
    )


def _render(fmt: ReportFormat, report: Report) -> str:
    out = io.StringIO()
    assert emit(report, [(fmt, None)], stdout=out) == []
    return out.getvalue()


# -- the GitHub runner's command parser, from its documented rules --------------------------------


def _unescape(value: str, prop: bool) -> str:
    pairs = [("%0D", "\r"), ("%0A", "\n")] + ([("%3A", ":"), ("%2C", ",")] if prop else []) + [("%25", "%")]
    for enc, dec in pairs:
        value = value.replace(enc, dec)
    return value


def workflow_commands(output: str) -> list[tuple[str, dict[str, str], str]]:
    """Every workflow command GitHub's runner would run in `output`: a line (CR, LF or CRLF end one)
    that starts with `::` once leading whitespace is trimmed (`::name k=v,k=v::data`), and any line
    holding `##[` (the older syntax, found anywhere in a line). Any name counts (stricter than the runner,
    which runs only registered ones)."""
    found: list[tuple[str, dict[str, str], str]] = []
    for line in re.split(r"\r\n|\r|\n", output):
        body = line.lstrip(_NET_SPACE)
        if body.startswith("::"):
            end = body.find("::", 2)
            if end >= 0:
                name, _, props = body[2:end].partition(" ")
                pairs = [p.split("=", 1) for p in props.split(",") if "=" in p]
                found.append((name, {k: _unescape(v, True) for k, v in pairs}, _unescape(body[end + 2 :], False)))
                continue
        i = line.find("##[")
        if i >= 0 and "]" in line[i:]:
            found.append((line[i + 3 : line.index("]", i)].split(" ")[0], {}, line[line.index("]", i) + 1 :]))
    return found


def test_the_parser_sees_what_the_runner_runs() -> None:
    """The parser is not vacuous: it finds the commands the issue's attack put into step output."""
    assert [c[0] for c in workflow_commands("a\n  ::add-mask::x\r::error title=a%3Ab::m%0An\nb ##[group]t")] == [
        "add-mask",
        "error",
        "group",
    ]
    assert workflow_commands("::error title=a%3Ab::m%0An")[0][1:] == ({"title": "a:b"}, "m\nn")


# -- terminal and step output ---------------------------------------------------------------------


@_settings()
@given(text=server_text)
@example(text="0.5.22\n::add-mask::abc\n  ::error title=x::forged\r::stop-commands::tok\n##[group]x")
@example(text="\x1b[2J\x1b]0;title\x07\u202egnp.exe")
@example(text="[bold]not markup[/] :smile:")
def test_terminal_output_carries_no_control_and_no_command(text: str) -> None:
    out = _render(ReportFormat.TABLE, _report(text))
    assert not _HIDDEN.search(out), repr(out)
    assert workflow_commands(out) == [], out
    shown = "".join(sinks.terminal(text).split())
    assert shown.replace(sinks.ZWSP, "") in "".join(out.split()).replace(sinks.ZWSP, "")


@_settings()
@given(text=server_text)
@example(text="x\n::error::y")
def test_stderr_lines_carry_no_command(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    sinks.echo(f"kvgate: error: {text}", err=True)
    err = capsys.readouterr().err
    assert not _HIDDEN.search(err.rstrip("\n"))
    assert workflow_commands(err) == []
    assert err.count("\n") == 1
    # an error carrying a log tail keeps its lines, each indented under the first, none a command
    sinks.echo(f"kvgate: error: {text}", err=True, indent_lines=True)
    err = capsys.readouterr().err
    assert workflow_commands(err) == []
    assert not _HIDDEN.search(err.replace("\n", ""))
    assert all(line.startswith("  ") for line in err.split("\n")[1:-1])


# -- Markdown -------------------------------------------------------------------------------------

_MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _structure(md: str) -> tuple[list[str], Counter[str]]:
    tokens = _MD.parse(md)
    blocks = [t.type for t in tokens if t.type != "inline"]
    inline: Counter[str] = Counter()
    for t in tokens:
        for c in t.children or []:
            inline[c.type] += 1
    del inline["text"]
    return blocks, inline


def _md_text(md: str) -> str:
    out = []
    for t in _MD.parse(md):
        out += [c.content for c in t.children or [] if c.type in ("text", "code_inline")]
    return "".join("".join(out).split())


@_settings()
@given(text=server_text)
@example(text="<KVGM3LND4CJAC>")
@example(text="1.0\r## PASSED (exit 0)\r<!-- ")
@example(text="| x | y |\n| --- | --- |")
@example(text="    # heading [link](http://e.x) ![i](y) *em* `code` <b>html</b> &amp; ~~s~~ $x$")
def test_markdown_shows_the_text_and_no_structure(text: str) -> None:
    md = _render(ReportFormat.MARKDOWN, _report(text))
    harmless = _render(ReportFormat.MARKDOWN, _report("x" if text else ""))
    assert _structure(md) == _structure(harmless), md
    assert "\r" not in md
    shown = "".join(sinks.visible(text).split())
    assert shown in _md_text(md).replace("\u00a0", "")


def test_a_leaked_sentinel_name_shows_in_the_step_summary() -> None:
    md = _render(ReportFormat.MARKDOWN, _report("<KVGM3LND4CJAC>"))
    html = _MD.render(md)
    assert "&lt;KVGM3LND4CJAC&gt;" in html and "<KVGM3LND4CJAC>" not in html


# -- XML (JUnit) ----------------------------------------------------------------------------------


@_settings()
@given(text=server_text)
@example(text="\x00\x0b\x1b\ud800\ufffe\uffff]]><x/>")
def test_junit_is_well_formed_and_shows_the_text(text: str) -> None:
    out = _render(ReportFormat.JUNIT, _report(text))
    root = ET.fromstring(out.split("\n", 1)[1])
    harmless = ET.fromstring(_render(ReportFormat.JUNIT, _report("x")).split("\n", 1)[1])
    assert [e.tag for e in root.iter()] == [e.tag for e in harmless.iter()]
    failure = root.find(".//failure")
    assert failure is not None
    # (on stdout, `##[` is broken for the CI log as everywhere there: sinks.defang_step_output)
    want = f"version {sinks.xml(text)} is too old".replace("##[", "#" + sinks.ZWSP + "#[")
    assert failure.get("message") == want


# -- workflow commands (tools/gha_report.py) --------------------------------------------------------


def _gha() -> Any:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gha_report
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return gha_report


@_settings()
@given(text=server_text)
@example(text="a,b:c%0A\r\n::error::x ##[set-output name=a;]b")
def test_annotations_unescape_to_the_text_and_nothing_else(text: str) -> None:
    gha = _gha()
    doc = {"strict": True, "findings": [{"id": text, "outcome": "failed", "node": text, "summary": text}]}
    lines = gha.annotations(doc)
    assert len(lines) == 1
    cmds = workflow_commands("\n".join(lines))
    assert len(cmds) == 1
    name, props, data = cmds[0]
    assert name == "error"
    assert props == {"title": sinks.terminal(text).replace("##[", "#" + sinks.ZWSP + "#[")}
    assert data == sinks.terminal(f"{text}: failed: {text}").replace("##[", "#" + sinks.ZWSP + "#[")


def test_at_most_ten_error_annotations_then_how_many_more_and_where() -> None:
    gha = _gha()
    doc = {"findings": [{"id": f"c.{i}", "outcome": "failed", "node": "n", "summary": "s"} for i in range(25)]}
    lines = gha.annotations(doc, "the step summary and r.json")
    assert len(lines) == 10
    assert [ln.split(" ", 1)[0] for ln in lines] == ["::error"] * 10
    more = workflow_commands(lines[-1])[0][2]
    assert more == "16 more findings at this level; all are in the step summary and r.json"


def test_a_content_leak_keeps_its_annotation_slot_among_a_fleets_per_worker_findings() -> None:
    """GitHub shows 10 annotations per level per step: a thousand workers failing their pool, and a dozen
    other checks listed before it, must not push the leak out. One annotation per check ID, ranked."""
    gha = _gha()
    per_worker = [
        {"id": f"fleet.c{j}", "outcome": "failed", "node": f"prefill[{i}]", "summary": "s"}
        for j in range(12)
        for i in range(100)
    ]
    pools = [
        {"id": "pool-context.headroom", "outcome": "failed", "node": f"prefill[{i}]", "summary": "pool"}
        for i in range(1000)
    ]
    leak = {"id": "probes.canary.round_a", "outcome": "failed", "node": "router", "summary": "foreign sentinel"}
    lines = gha.annotations({"findings": [*per_worker, *pools, leak]}, "r.json")
    assert len(lines) == 10
    cmds = [workflow_commands(ln)[0] for ln in lines]
    assert [c[1]["title"] for c in cmds[:2]] == ["probes.canary.round_a", "pool-context.headroom"]
    assert "999 more finding(s) of this check" in cmds[1][2]
    assert cmds[-1][2] == f"{12 * 100 - 7 * 100} more findings at this level; all are in r.json"


def test_the_step_summary_gets_no_carriage_return(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30, case 4: a CR read by universal newlines forged a heading in $GITHUB_STEP_SUMMARY."""
    gha = _gha()
    md = tmp_path / "k.md"
    md.write_bytes(b"## kvgate check: GATE FAILED (exit 1)\n| x | 1.0\r## PASSED (exit 0)\r<!-- |\n")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    gha.main(["gha_report.py", str(tmp_path / "none.json"), str(md)])
    text = summary.read_bytes().decode()
    assert "\r" not in text
    assert [ln for ln in text.split("\n") if ln.startswith("## ")] == ["## kvgate check: GATE FAILED (exit 1)"]


# -- Prometheus labels -----------------------------------------------------------------------------


@_settings(max(20, EXAMPLES // 3))
@given(text=server_text)
@example(text='a"} 1\nkvgate_verdict 0\n# EOF')
def test_metric_labels_show_the_text_and_add_no_series(text: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from kvgate.watch.metrics import WatchMetrics

    def samples(node: str) -> list[Any]:
        m = WatchMetrics(lambda: None)
        m.set_report(Report(command="watch", findings=(Finding("g", "c", node, Outcome.FAILED, "s"),)))
        m.set_ratios([(node, "prefill", 1.5)])
        return [s for fam in text_string_to_metric_families(m.render().decode()) for s in fam.samples]

    got, harmless = samples(text), samples("x")
    assert [s.name for s in got] == [s.name for s in harmless]
    outcome = [s for s in got if s.name == "kvgate_check_outcome"]
    assert [s.labels["node"] for s in outcome] == [sinks.prom_label(text)]
    assert [s.value for s in got if s.name == "kvgate_verdict"] == [1.0]


# -- secrets in the forms kvgate derives --------------------------------------------------------

B64TOKEN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/"


def _derived_fragments(token: str, text: str) -> list[str]:
    """8-character pieces of the token, in any case, as is or percent-encoded, found in `text`."""
    found = []
    low = text.lower()
    for form in {token, quote(token, safe=""), quote(token)}:
        f = form.lower()
        k = min(R.FRAGMENT, len(f))
        found += [f[i : i + k] for i in range(len(f) - k + 1) if f[i : i + k] in low]
    return found


@_settings(max(20, EXAMPLES // 3))
@given(token=st.text(alphabet=B64TOKEN, min_size=16, max_size=64), fold=st.sampled_from(["lower", "upper", "quote"]))
def test_no_fragment_of_a_derived_form_reaches_any_format(token: str, fold: str) -> None:
    # Hypothesis draws text from the test's own literals too: a token holding "defenses" (the report's
    # gate) has kvgate's own words masked, rightly, and the check ID then breaks the schema. Such a
    # token says nothing about a server's text reaching a sink.
    assume(not any(_derived_fragments(token, _render(fmt, _report("x"))) for fmt in ReportFormat))
    R.register(token)
    derived = {"lower": token.lower(), "upper": token.upper(), "quote": quote(token, safe="")}[fold]
    report = _report(f"http://{derived}:8000/x")
    for fmt in ReportFormat:
        out = _render(fmt, report)
        assert _derived_fragments(token, out) == [], (fmt, out)
