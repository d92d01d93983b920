"""Every way a run can end writes the report first and exits with a code that says what happened.

Issue 10 route 5: a malformed URL was a traceback and exit 1 ("gate failed") with no report; any
unexpected exception must still write every requested report and exit 2 (usage), 4 (transport) or
5 (kvgate's own crash), never a traceback and never 0 or 1.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.conftest import PayloadServer, Route

runner = CliRunner()


def _invoke(tmp_path: Path, *args: str) -> tuple[Any, dict[str, Any]]:
    out = tmp_path / "r.json"
    res = runner.invoke(app, [*args, "-f", "json", "-o", str(out)])
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res, json.loads(out.read_text())


@pytest.mark.parametrize("flag", ["--prefill-url", "--decode-url", "--router-url"])
@pytest.mark.parametrize("url", ["http://[::1", "http://", "http://exa mple.com:99999", "https://:80/x"])
def test_malformed_url_is_a_usage_error_with_a_report(tmp_path: Path, flag: str, url: str) -> None:
    args = ["check", "-q", flag, url]
    if flag == "--router-url":
        args += ["--prefill-url", "http://127.0.0.1:9"]
    res, doc = _invoke(tmp_path, *args)
    assert res.exit_code == doc["exit_status"] == ExitStatus.USAGE_ERROR, res.output
    assert flag in res.stderr and url in res.stderr


def test_fixes_malformed_url_is_a_usage_error_with_a_report(tmp_path: Path) -> None:
    res, doc = _invoke(tmp_path, "fixes", "--url", "http://[::1")
    assert res.exit_code == doc["exit_status"] == ExitStatus.USAGE_ERROR


def test_unexpected_crash_in_check_writes_the_report_and_exits_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvgate.pipeline.check as pipeline  # `check` imports run_check when it runs (a light --help)

    def boom(*a: Any, **k: Any) -> None:
        raise KeyError("something kvgate did not expect")

    monkeypatch.setattr(pipeline, "run_check", boom)
    res, doc = _invoke(tmp_path, "check", "-q", "--prefill-url", "http://127.0.0.1:9")
    assert res.exit_code == doc["exit_status"] == ExitStatus.INTERNAL_ERROR
    assert doc["findings"][0]["check"] == "internal" and "KeyError" in doc["findings"][0]["summary"]
    assert "internal error" in res.stderr


def test_unexpected_crash_in_fixes_writes_the_report_and_exits_5(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvgate.catalogue as cmd  # `fixes` imports the catalogue when it runs (a light --help)

    monkeypatch.setattr(cmd, "assess_version", lambda *a, **k: 1 / 0)
    res, doc = _invoke(tmp_path, "fixes", "--release", "0.5.22")
    assert res.exit_code == doc["exit_status"] == ExitStatus.INTERNAL_ERROR
    assert "ZeroDivisionError" in doc["findings"][0]["summary"]


def test_a_crashing_gate_is_internal_not_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, payload_server: Callable[..., PayloadServer]
) -> None:
    from kvgate.gates.pool_context import PoolContextGate

    srv = payload_server(
        {"/server_info": Route(P.server_info("0.5.22", pool=2_040_000)), "/v1/models": Route(P.v1_models())}
    )
    monkeypatch.setattr(PoolContextGate, "run", lambda self, ctx: [][1])
    res, doc = _invoke(tmp_path, "check", "-q", "--prefill-url", srv.url, "--no-strict")
    assert res.exit_code == doc["exit_status"] == ExitStatus.INTERNAL_ERROR, res.output
    crash = [f for f in doc["findings"] if f["check"] == "internal"]
    assert crash and "IndexError" in crash[0]["summary"]


def test_a_redirect_is_not_read_as_the_document(tmp_path: Path, payload_server: Callable[..., PayloadServer]) -> None:
    good = P.server_info("0.5.22", pool=2_040_000)
    srv = payload_server({"/server_info": Route(good, status=302), "/v1/models": Route(P.v1_models())})
    res, doc = _invoke(tmp_path, "check", "-q", "--prefill-url", srv.url, "--no-strict")
    assert res.exit_code == doc["exit_status"] == ExitStatus.TRANSPORT_ERROR, res.output
    assert "redirect" in doc["findings"][0]["summary"]


def test_a_run_that_checked_nothing_never_passes_even_without_strict() -> None:
    from kvgate.results.findings import Report, exit_status_for

    assert exit_status_for([], strict=False) == ExitStatus.INCONCLUSIVE
    assert Report("fixes", (), strict=False).exit_status == ExitStatus.INCONCLUSIVE


def test_sigterm_mid_run_writes_the_report_and_exits_130(
    tmp_path: Path, payload_server: Callable[..., PayloadServer]
) -> None:
    """A pipeline step timeout sends SIGTERM: the real `kvgate` process, stuck reading a worker that does
    not answer, still writes its report (no verdict) and exits 130, never 0."""
    stuck = payload_server(
        {"/server_info": Route(P.server_info(), delay_s=60), "/get_server_info": Route(P.server_info(), delay_s=60)}
    )
    out = tmp_path / "r.json"
    kvgate = Path(sys.executable).with_name("kvgate")
    proc = subprocess.Popen(
        [str(kvgate), "check", "-q", "--prefill-url", stuck.url, "--timeout", "20", "-f", "json", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not stuck.seen_headers and time.monotonic() < deadline:  # it is reading the worker now
        time.sleep(0.1)
    assert stuck.seen_headers, "kvgate never reached the worker"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitStatus.INTERRUPTED == 130, err
    doc = json.loads(out.read_text())
    assert doc["exit_status"] == 130 and doc["verdict"] == "interrupted"
    assert "interrupted" in doc["findings"][0]["summary"] and "interrupted" in err


# --- where the verdict and errors go (issue 42) --------------------------------------------------

KVGATE = [sys.executable, "-c", "from kvgate.cli import main; main()"]


def _kvgate(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVGATE, *args], text=True, timeout=120, **kwargs)


def test_an_error_is_said_once_where_stdout_and_stderr_meet() -> None:
    """`2>&1` into a log or a pipe: the table carries the error, stderr does not repeat it there; where
    the two streams go apart, stderr still says it."""
    res = _kvgate("fixes", "--release", "garbage", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert res.returncode == 2 and res.stdout.count("not a PEP 440") == 1, res.stdout
    res = _kvgate("fixes", "--release", "garbage", capture_output=True)  # two pipes
    assert res.returncode == 2 and "not a PEP 440" in res.stdout and "not a PEP 440" in res.stderr


@pytest.mark.parametrize("fmt", ["json", "sarif"])
def test_a_machine_format_on_stdout_leaves_the_verdict_and_errors_on_stderr(fmt: str) -> None:
    res = _kvgate("fixes", "--release", "0.5.20", "-f", fmt, capture_output=True)
    assert res.returncode == 1 and json.loads(res.stdout)  # stdout is the document alone
    assert res.stderr.strip().splitlines()[-1].startswith("kvgate fixes: GATE FAILED") and "(exit 1)" in res.stderr
    res = _kvgate("fixes", "--release", "garbage", "-f", fmt, capture_output=True)
    assert res.returncode == 2 and json.loads(res.stdout)
    assert "kvgate: error:" in res.stderr and "not a PEP 440" in res.stderr and "USAGE ERROR" in res.stderr


def test_an_unwritable_output_is_a_usage_error_in_the_table_too(tmp_path: Path) -> None:
    """The table must not say PASSED (exit 0) while the process exits 2."""
    missing = tmp_path / "no-such-folder" / "r.json"
    for target in (missing, tmp_path):  # a folder that is not there; a folder given as the file
        res = runner.invoke(app, ["fixes", "--release", "0.5.22", "-f", "json", "-o", str(target)])
        assert res.exit_code == 2, res.output
        assert "USAGE ERROR" in res.stdout and "PASSED" not in res.stdout and "(exit 0)" not in res.stdout
        assert "cannot write the json report to" in " ".join(res.stdout.split())
    # a verdict that is not a pass stands (exit 1), and says the file is missing
    res = runner.invoke(app, ["fixes", "--release", "0.5.20", "-f", "json", "-o", str(missing)])
    assert res.exit_code == 1 and "cannot write the json report" in " ".join(res.output.split())
