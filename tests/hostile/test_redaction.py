"""A token echoed by a hostile server never reaches any output, whole or in fragments (issue 20, case 4).

The rule under test (kvgate/output/redact.py, docs/security.md): for a registered secret S and k = min(8, len(S)),
no output contains a k-character substring of S, also not once the line breaks (and the padding and
table borders around them) of a folded table are looked through. Tokens are drawn from RFC 6750's
b64token alphabet, 16-256 characters, and echoed at every offset: through `redact`/`clip`/`emit`
directly (every offset, every format), and through the real CLI against a real socket server that
echoes the Authorization header in a 500 body (offsets around the 200-character cut, and drawn by
hypothesis).
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.formats import ReportFormat
from kvgate.formats.reporting import emit
from kvgate.formats.table import TableFormatter
from kvgate.gates.probes.client import ProbeResult
from kvgate.gates.probes.contract import classify
from kvgate.gates.probes.plan import ACCEPT, REJECT, LengthProbe
from kvgate.output import redact as R
from kvgate.results.findings import Evidence, Finding, Outcome, Report
from tests.assets.loopback import LoopbackServer

B64TOKEN = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/"
# Text around the token that shares no character with it, so "no character of the token survives" can be
# asserted exactly, not only "no 8-character fragment".
OTHER = ' {}:"#,;!?()[]<>@$^&'
EXAMPLES = int(os.environ.get("KVGATE_FUZZ_EXAMPLES", "200"))
CLI_EXAMPLES = max(10, EXAMPLES // 8)
_AROUND = r"(?:\x1b\[[0-9;]*m|[ \t│┃║|])*"
_JOINT = re.compile(_AROUND + r"\r?\n" + _AROUND)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

tokens = st.text(alphabet=B64TOKEN, min_size=16, max_size=256)
other_text = st.text(alphabet=OTHER, max_size=300)
runner = CliRunner()


@pytest.fixture(autouse=True)
def _forget_secrets() -> Iterator[None]:
    """Each test's tokens are forgotten after it (a low-entropy token would mask other tests' text)."""
    with R.scope():
        yield


def fragments(secret: str, text: str) -> list[str]:
    """Every k-character piece of `secret` (k = min(8, len)) found in `text` or in `text` with its line
    breaks looked through: what the rule says must be empty."""
    k = min(R.FRAGMENT, len(secret))
    grams = {secret[i : i + k] for i in range(len(secret) - k + 1)}
    found = []
    for view in (text, _JOINT.sub("", text), _ANSI.sub("", _JOINT.sub("", text))):
        found += [view[i : i + k] for i in range(len(view) - k + 1) if view[i : i + k] in grams]
    return found


def _settings(n: int) -> Any:
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# -- the rule, on text ------------------------------------------------------------------------------
@_settings(EXAMPLES)
@given(token=tokens, before=other_text, after=other_text)
def test_redact_leaves_no_character_of_a_token_at_any_offset(token: str, before: str, after: str) -> None:
    R.register(token)
    out = R.redact(before + token + after)
    assert out == before + R.MASK + after


@_settings(EXAMPLES)
@given(token=tokens, before=other_text, after=other_text, limit=st.integers(1, 600))
def test_clip_redacts_before_it_cuts(token: str, before: str, after: str, limit: int) -> None:
    """A body cut anywhere, also inside the token, shows none of its characters (not a 1-character prefix)."""
    R.register(token)
    out = R.clip(before + token + after, limit)
    assert not set(out) & set(B64TOKEN), out
    assert not fragments(token, out)


def test_clip_every_cut_of_every_offset() -> None:
    """Deterministic sweep: a 40-character token at every offset of a 260-character body, cut at 200."""
    token = "tok_" + "Zq9-xY7.w~" * 3 + "Ab12+/"
    R.register(token)
    for offset in range(0, 221):
        body = "#" * offset + token + "#" * (260 - offset - len(token))
        out = R.clip(body, 200)
        assert not set(out) & set(B64TOKEN), (offset, out)


@_settings(EXAMPLES)
@given(
    token=tokens,
    before=other_text,
    after=other_text,
    breaks=st.lists(st.tuples(st.integers(0, 600), st.sampled_from(["\n", "\n    ", " │\n│ ", "\r\n  "])), max_size=8),
)
def test_redact_output_sees_through_folded_lines(
    token: str, before: str, after: str, breaks: list[tuple[int, str]]
) -> None:
    """A token folded across lines (pieces of any length, even 1 character) is masked on the final bytes."""
    R.register(token)
    text = before + token + after
    for pos, joint in sorted(breaks, reverse=True):
        pos = min(pos, len(text))
        text = text[:pos] + joint + text[pos:]
    out = R.redact_output(text)
    assert not set(out) & set(B64TOKEN), out


@_settings(EXAMPLES // 2)
@given(token=tokens)
def test_escaped_forms_are_redacted_too(token: str) -> None:
    """A server may echo the token URL-encoded or JSON-escaped: those spellings are secrets as well."""
    from urllib.parse import quote

    R.register(token)
    for form in (quote(token, safe=""), json.dumps(token)[1:-1]):
        assert not fragments(form, R.redact("x " + form + " y"))


# -- every format, at the output boundary ------------------------------------------------------------
def _report(token: str, offset: int) -> Report:
    pad = "p" * offset
    body = json.dumps({"detail": f"{pad}Bearer {token}"})
    return Report(
        command="check",
        findings=(
            Finding("target", "reachable", "decode[0] http://127.0.0.1:1", Outcome.ERROR, f"HTTP 500: {body!r}"),
            Finding(
                "probes",
                "contract",
                "router",
                Outcome.FAILED,
                "served text",
                (Evidence("router", "answer", body), Evidence("router", "ids", [token, offset])),
                remedy=f"see {token[: offset % (len(token) + 1)]}",
            ),
        ),
        notes=(f"note {token}",),
        target={"echo": {"auth": f"Bearer {token}"}},
    )


@pytest.mark.parametrize("fmt", list(ReportFormat))
@pytest.mark.parametrize("width", [60, 83, 100, 160])
def test_every_format_every_offset(tmp_path: Path, fmt: ReportFormat, width: int, monkeypatch: Any) -> None:
    """emit(): each format on stdout and in a file, a token at every offset of a quoted body, at widths that
    fold it differently. The last partial prefix (`remedy`) is a fragment too, when it is 8 or longer."""
    monkeypatch.setenv("COLUMNS", str(width))
    token = "sk-live-" + "A1b2C3d4E5f6G7h8" * 4
    R.register(token)
    for offset in range(0, 240, 7):
        out = io.StringIO()
        dest = tmp_path / f"r.{fmt.value}"
        problems = emit(_report(token, offset), [(fmt, None), (fmt, dest)], stdout=out, verbose=True)
        assert problems == []
        for text in (out.getvalue(), dest.read_text(encoding="utf-8")):
            assert not fragments(token, text), (fmt, width, offset)


@_settings(EXAMPLES // 4)
@given(token=tokens, offset=st.integers(0, 400), width=st.integers(60, 200))
def test_every_format_any_token(token: str, offset: int, width: int) -> None:
    R.register(token)
    for fmt in ReportFormat:
        out = io.StringIO()
        os.environ["COLUMNS"] = str(width)
        try:
            emit(_report(token, offset), [(fmt, None)], stdout=out, verbose=True)
        finally:
            del os.environ["COLUMNS"]
        assert not fragments(token, out.getvalue()), fmt


@pytest.mark.parametrize("color", [False, True])
def test_final_bytes_alone_catch_a_table_that_folds_a_token(color: bool) -> None:
    """Case 4's first half, on the final bytes only: the table renders an unredacted report and folds the
    token across lines (no piece need be 8 long), in colour or not; redact_output on what it rendered
    masks every piece."""
    token = "ghp_" + "k2J8mQ4xZ7vR1nB5" * 5
    report = _report(token, 37)
    text = TableFormatter(color=color, width=60, verbose=True).render(report)
    assert token not in text and fragments(token, text)  # folded: the whole token is not on one line
    R.register(token)
    out = R.redact_output(text)
    assert not fragments(token, out)


def test_probe_bodies_are_redacted_before_the_cut() -> None:
    """Every quoted /generate body of the probe contract: the token at every offset around the cut."""
    token = "eyJhbGciOi" + "JIUzI1NiIs" * 6
    R.register(token)
    probes = [
        LengthProbe("accept", 100, ACCEPT, "none", "why", 1),
        LengthProbe("reject", 10_000, REJECT, "pool", "why", 1),
    ]
    for status in (500, 400, 429, 200):
        for offset in range(120, 210):
            raw = "#" * offset + token + "#" * 50
            for probe in probes:
                res = ProbeResult(probe.name, probe.length, 1, status, 0.1, None, raw)
                why = classify(probe, res, limit_numbers=(9_999,), reject_within_s=5).detail
                assert not fragments(token, why), (status, offset, why)
                # What follows the padding in the quote is the mask, never a prefix of any length.
                assert set(re.findall(r"#+([^#'…]+)", why)) <= {R.MASK}, (status, offset, why)


# -- the real CLI against a real socket that echoes the Authorization header ---------------------------
class EchoServer:
    """Answers every GET with HTTP 500 and a JSON body quoting the request's Authorization header after
    `pad` characters (set per run)."""

    def __init__(self) -> None:
        self.pad = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                auth = self.headers.get("Authorization", "")
                data = json.dumps({"detail": "x" * owner.pad + auth}).encode()
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


Pair = tuple[EchoServer, EchoServer]


@pytest.fixture(scope="module")
def echo() -> Iterator[Pair]:
    pair = (EchoServer(), EchoServer())
    yield pair
    for srv in pair:
        srv.stop()


def _cli_outputs(tmp_path: Path, echo: Pair, token: str, pad: int, quiet: bool = True) -> tuple[int, list[str]]:
    """`kvgate check` of a prefill and a decode that both echo the token; every format to a file, the
    table (and progress, unless quiet) on stdout/stderr. The exit status and every output."""
    for srv in echo:
        srv.pad = pad
    outs = {fmt: tmp_path / f"report.{fmt.value}" for fmt in ReportFormat}
    args = ["check", "--prefill-url", echo[0].url, "--decode-url", echo[1].url, "--token-env", "KVGATE_HOSTILE_TOKEN"]
    args += ["--quiet"] if quiet else []
    for fmt, path in outs.items():
        args += ["-f", fmt.value, "-o", str(path)]
    res = runner.invoke(app, args, env={"KVGATE_HOSTILE_TOKEN": token, "COLUMNS": "60"})
    texts = [res.stdout, res.stderr, *(p.read_text(encoding="utf-8") for p in outs.values())]
    return res.exit_code, texts


# Where the token starts relative to the 200-character cut of the quoted body: wholly before it, across
# it by 1..n characters on either side, just after it.
_CUT = 200
_BODY_HEAD = len('{"detail": "') + len("Bearer ")


@pytest.mark.parametrize("start", [-120, -91, -90, -89, -9, -8, -7, -5, -1, 0, 1, 5])
def test_case4_a_500_body_echoing_the_token_at_the_cut(tmp_path: Path, echo: Pair, start: int) -> None:
    """Case 4, rebuilt: the token in a 500 body, cut at 200 characters anywhere in it; the table at 60
    columns folds it. Nothing of it reaches stdout, stderr or any format (exit 4: nothing was read)."""
    token = "sk-kvgate-" + "0123456789abcdef" * 5  # 90 characters: the 60-column table folds it
    pad = max(0, _CUT + start - _BODY_HEAD)
    code, texts = _cli_outputs(tmp_path, echo, token, pad)
    assert code == 4
    for text in texts:
        assert not fragments(token, text)
        assert "kvgate-0" not in text and "sk-kvgat" not in text


def test_case4_progress_lines_and_a_long_token(tmp_path: Path, echo: Pair) -> None:
    """Without --quiet the progress lines go to stderr too; a 256-character token folds over several lines."""
    token = ("Zx9_" + "q" * 3 + "W8v-") * 23 + "abcdefgh"
    code, texts = _cli_outputs(tmp_path, echo, token[:256], pad=3, quiet=False)
    assert code == 4
    for text in texts:
        assert not fragments(token[:256], text)


@_settings(CLI_EXAMPLES)
@given(token=tokens, pad=st.integers(0, 260))
def test_case4_any_token_any_offset_through_the_cli(
    tmp_path_factory: pytest.TempPathFactory, token: str, pad: int
) -> None:
    pair = (EchoServer(), EchoServer())
    try:
        code, texts = _cli_outputs(tmp_path_factory.mktemp("cli"), pair, token, pad)
    finally:
        for srv in pair:
            srv.stop()
    assert code == 4
    for text in texts:
        assert not fragments(token, text)


def test_progress_lines_and_rich_frames_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both observers write their final bytes through the redacting stream (Rich folds long lines itself)."""
    from kvgate.output.progress import LineObserver, RichObserver

    token = "prg_" + "Qw3rTy7uI9oP" * 8
    R.register(token)
    plain = io.StringIO()
    obs = LineObserver(plain)
    obs.log(f"reading {token} at offset")
    with obs.step(f"step {token[:20]}"):
        pass
    rich_err = io.StringIO()
    monkeypatch.setattr("sys.stderr", rich_err)
    fancy = RichObserver()
    fancy.log(f"reading {'#' * 50}{token}")
    with fancy.step(f"describing {token}", total=2) as handle:
        handle.advance(1)
    for text in (plain.getvalue(), rich_err.getvalue()):
        assert text and not fragments(token, text)


def test_a_commands_secrets_are_its_own(tmp_path: Path, echo: Pair) -> None:
    """The token a command read is forgotten when it exits: the next run in the same process starts clean."""
    token = "own_" + "Zm9vYmFyYmF6" * 3
    code, texts = _cli_outputs(tmp_path, echo, token, pad=0)
    assert code == 4 and not any(fragments(token, t) for t in texts)
    assert token not in R.secrets()


def test_the_token_is_known_before_the_first_error(tmp_path: Path) -> None:
    """A usage error raised before the command reads its token (here: a profile path) is redacted too."""
    token = "early-Tok3n-0123456789-abcdefghij"
    out = tmp_path / "r.json"
    res = runner.invoke(
        app,
        ["check", "--quiet", "--prefill-url", "http://127.0.0.1:1", "--token-env", "KVGATE_HOSTILE_TOKEN"]
        + ["--profile", f"/nonexistent/{token}.yaml", "-f", "json", "-o", str(out)],
        env={"KVGATE_HOSTILE_TOKEN": token},
    )
    assert res.exit_code == 2, res.output
    assert "profile" in res.stderr and R.MASK in res.stderr
    for text in (res.stdout, res.stderr, out.read_text()):
        assert not fragments(token, text)
