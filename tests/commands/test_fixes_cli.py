"""`kvgate fixes` run in-process through the real CLI app."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.cli import app
from kvgate.formats import ReportFormat
from tests.catalogue.helpers import add_marker, commit_release, copy_signature_tree, init_repo, wheel
from tests.conftest import Route

runner = CliRunner()


def _run(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["fixes", *args], env=env)


def _run_app(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def _json(*args: str) -> tuple[int, dict]:
    res = _run(*args, "--format", "json")
    return res.exit_code, json.loads(res.stdout)


def _presence(doc: dict) -> dict[str, str]:
    out = {}
    for f in doc["findings"]:
        assert f["gate"] == "fixes"
        out[f["check"]] = next(e["value"] for e in f["evidence"] if e["field"] == "present")
    return out


# --- by version ------------------------------------------------------------------------------


def test_version_0_5_20_fails_with_36988_present_and_38935_absent() -> None:
    code, doc = _json("--release", "0.5.20")
    assert code == 1 and doc["exit_status"] == 1
    p = _presence(doc)
    assert p["pr-36988"] == "present" and p["pr-38935"] == "absent"
    failed = {f["check"] for f in doc["findings"] if f["outcome"] == "failed"}
    assert "pr-38935" in failed and "pr-36988" not in failed
    door = next(f for f in doc["findings"] if f["check"] == "pr-38935")
    assert "kvgate backport --release" in door["remedy"]
    assert not any(c.startswith("kvgate-") for c in p), "backports are not shown for a bare version"


@pytest.mark.parametrize("version, code", [("0.5.19", 1), ("0.5.20", 1), ("0.5.21", 1), ("0.5.22", 0), ("0.5.23", 0)])
def test_exit_status_per_release(version: str, code: int) -> None:
    assert _run("--release", version).exit_code == code


def test_table_shows_fix_class_presence_and_how() -> None:
    res = _run("--release", "0.5.20")
    out = res.stdout
    assert "pr-38935" in out and "absent" in out and "admission" in out and "by version" in out
    # fixes judged code, not a deployment: no "do not promote"
    assert out.startswith("kvgate fixes: GATE FAILED: the code lacks a correctness fix or carries a tampered backport")


def test_garbage_version_exits_2_with_a_clear_message() -> None:
    res = _run("--release", "garbage")
    assert res.exit_code == 2
    assert "not a PEP 440 version" in res.stderr
    # The report is written before the exit, as in every command: the verdict, then the one error.
    assert res.stdout.startswith("kvgate fixes: USAGE ERROR: the gate did not run (exit 2)")
    assert "kvgate.run" in res.stdout and "not a PEP 440 version" in res.stdout


def test_post_release_is_unknown_not_passed() -> None:
    code, doc = _json("--release", "0.5.20.post1")
    assert code == 3  # nothing known to be missing, but the door is unknown: never a silent pass
    door = next(f for f in doc["findings"] if f["check"] == "pr-38935")
    assert door["outcome"] == "inconclusive"
    assert "pr-38935" in doc["target"]["unproven_correctness"]
    # --no-strict opts out of doubt about informational entries, never about a correctness fix
    assert _run("--release", "0.5.20.post1", "--no-strict").exit_code == 3


def test_dev_version_with_commit() -> None:
    code, doc = _json("--release", "0.5.21.dev12+g8f3d694")
    assert code == 1  # ack-generations is not even in 0.5.21 final
    door = next(f for f in doc["findings"] if f["check"] == "pr-38935")
    assert door["outcome"] == "inconclusive" and "8f3d694" in json.dumps(door["evidence"])


def test_mori_backend_makes_the_mori_fix_required() -> None:
    code, doc = _json("--release", "0.5.21", "--backend", "mori")
    assert code == 1
    failed = {f["check"] for f in doc["findings"] if f["outcome"] == "failed"}
    assert failed == {"ack-generations", "mori-deferred-release"}


# --- usage errors ----------------------------------------------------------------------------


def test_two_sources_is_a_usage_error() -> None:
    res = _run("--release", "0.5.22", "--url", "http://127.0.0.1:1")
    assert res.exit_code == 2 and "give one of" in res.stderr


def test_rev_without_repo_is_a_usage_error() -> None:
    assert _run("--rev", "HEAD", "--release", "0.5.22").exit_code == 2


def test_missing_site_packages_is_a_usage_error(tmp_path: Path) -> None:
    res = _run("--site-packages", str(tmp_path))
    assert res.exit_code == 2 and "no sglang package" in res.stderr


def test_auto_detect_without_sglang_is_a_usage_error() -> None:
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is importable in this interpreter")
    res = _run("--site-packages", "auto")
    assert res.exit_code == 2 and "no sglang importable" in res.stderr


# --- every format, files -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(ReportFormat))
def test_every_format_renders(fmt: ReportFormat, tmp_path: Path) -> None:
    out = tmp_path / f"report.{fmt.value}"
    res = _run("--release", "0.5.20", "--format", fmt.value, "--output", str(out))
    assert res.exit_code == 1
    text = out.read_text()
    assert "pr-38935" in text
    assert "pr-38935" in res.stdout  # the table still goes to the job log


# --- by source (real wheels) -------------------------------------------------------------------


@pytest.mark.wheels
@pytest.mark.parametrize("version, code", [("0.5.20", 1), ("0.5.21", 1), ("0.5.22", 0), ("0.5.23", 0)])
def test_site_packages_real_wheels(version: str, code: int) -> None:
    rc, doc = _json("--site-packages", str(wheel(version)))
    assert rc == code
    assert doc["target"]["release"] == version and "source" in doc["target"]["methods"]
    p = _presence(doc)
    if version == "0.5.20":
        assert p["pr-36988"] == "present" and p["pr-38935"] == "absent"


@pytest.mark.wheels
def test_site_packages_patched_0_5_20(tmp_path: Path) -> None:
    copy_signature_tree("0.5.20", tmp_path / "site" / "sglang")
    applied = _run_app("backport", "--release", "v0.5.20", "--site-packages", str(tmp_path / "site"))
    assert applied.exit_code == 0, applied.output
    rc, doc = _json("--site-packages", str(tmp_path / "site"))
    assert rc == 0, doc["target"]  # every correctness fix present or stood in for (issue 21)
    assert doc["target"]["reads_as"] == (
        "0.5.20 + kvgate backports (kvgate-admission-door, kvgate-deferred-release-default, "
        "kvgate-preserve-abort-ack, kvgate-ack-fanout, kvgate-force-arm-on-failure, kvgate-ack-generations)"
    )
    by = {f["check"]: f for f in doc["findings"]}
    for fix, bp in (
        ("pr-40645", "kvgate-preserve-abort-ack"),
        ("pr-41402", "kvgate-ack-fanout"),
        ("pr-41404", "kvgate-force-arm-on-failure"),
        ("ack-generations", "kvgate-ack-generations"),
    ):
        assert by[fix]["outcome"] == "passed", by[fix]
        assert f"by kvgate backport {bp}, code verified" in by[fix]["summary"]
    door = next(f for f in doc["findings"] if f["check"] == "pr-38935")
    assert door["outcome"] == "passed" and "by kvgate backport kvgate-admission-door, code verified" in door["summary"]
    assert "version, which says absent" in door["summary"]


def test_site_packages_with_markers_only_is_tampered(tmp_path: Path) -> None:
    pkg = copy_signature_tree("0.5.20", tmp_path / "site" / "sglang")
    add_marker(pkg, "srt/disaggregation/prefill.py", "kvgate-admission-door")
    rc, doc = _json("--site-packages", str(tmp_path / "site"))
    assert rc == 1 and doc["target"]["reads_as"] == "0.5.20"
    assert doc["target"]["tampered_backports"] == ["kvgate-admission-door"]
    by = {f["check"]: f for f in doc["findings"]}
    assert by["kvgate-admission-door"]["outcome"] == "failed"
    assert by["kvgate-admission-door"]["summary"].startswith("tampered or partial backport")
    assert by["pr-38935"]["outcome"] == "failed"  # the comment does not bring the fix


@pytest.mark.wheels
def test_repo_and_rev(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "sglang")
    commit_release(repo, "0.5.21", "Release 0.5.21 sources (#99990)")
    commit_release(repo, "0.5.22", "[PD] Centralize drain-aware abort acknowledgements (#37077)")
    assert _run("--repo", str(tmp_path / "sglang")).exit_code == 0
    rc, doc = _json("--repo", str(tmp_path / "sglang"), "--rev", "HEAD~1")
    assert rc == 1 and doc["target"]["missing_correctness"] == ["ack-generations"]
    assert _run("--repo", str(tmp_path / "sglang"), "--rev", "nope").exit_code == 2


# --- by URL (real loopback HTTP server) ---------------------------------------------------------


def test_url_reads_version_from_server_info(payload_server) -> None:  # type: ignore[no-untyped-def]
    srv = payload_server({"/server_info": Route({"version": "0.5.22", "disaggregation_transfer_backend": "mooncake"})})
    rc, doc = _json("--url", srv.url)
    # a version string proves no fix: strict at the default, as `check` is on the same worker (exit 3)
    assert rc == 3 and doc["target"]["release"] == "0.5.22" and doc["target"]["backend"] == "mooncake"
    assert doc["strict"] is True and any(f["outcome"] == "inconclusive" for f in doc["findings"])
    remedies = " ".join(f.get("remedy") or "" for f in doc["findings"])
    # `fixes` has no --trust-version: its remedy names the opt-out it has, and that flag parses
    assert "--no-strict" in remedies and "--trust-version" not in remedies
    rc, doc = _json("--url", srv.url, "--no-strict")
    assert rc == 0 and any("strictness opted out (--no-strict)" in n for n in doc["notes"])
    srv20 = payload_server({"/server_info": Route({"version": "0.5.20"})})
    rc, doc = _json("--url", srv20.url)
    assert rc == 1 and _presence(doc)["pr-38935"] == "absent"


def test_url_falls_back_to_get_server_info(payload_server) -> None:  # type: ignore[no-untyped-def]
    srv = payload_server({"/get_server_info": Route({"version": "0.5.21"})})
    rc, doc = _json("--url", srv.url)
    assert rc == 1 and any("/get_server_info" in n for n in doc["notes"])


def test_url_with_token(payload_server) -> None:  # type: ignore[no-untyped-def]
    srv = payload_server({"/server_info": Route({"version": "0.5.23"})})
    args = ["--url", srv.url, "--token-env", "KVGATE_TEST_TOKEN", "--no-strict"]
    res = _run(*args, env={"KVGATE_TEST_TOKEN": "s3cret-tok"})
    assert res.exit_code == 0
    assert srv.seen_headers[-1].get("Authorization") == "Bearer s3cret-tok"
    assert "s3cret-tok" not in res.stdout


def test_url_without_version_is_inconclusive(payload_server) -> None:  # type: ignore[no-untyped-def]
    srv = payload_server({"/server_info": Route({"tp_size": 1})})
    rc, doc = _json("--url", srv.url)
    assert rc == 3 and doc["counts"]["inconclusive"] == len(doc["findings"]) > 0
    assert _run("--url", srv.url, "--no-strict").exit_code == 3  # no version: the fixes are unproven


def test_unreachable_url_exits_4() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        res = _run("--url", f"http://127.0.0.1:{port}", "--timeout", "2")
    assert res.exit_code == 4 and "unreachable" in res.stderr


def test_not_sglang_and_bad_json_exit_4(payload_server) -> None:  # type: ignore[no-untyped-def]
    srv = payload_server({})
    assert _run("--url", srv.url).exit_code == 4
    bad = payload_server({"/server_info": Route(raw=b"<html>")})
    assert _run("--url", bad.url).exit_code == 4


def test_probe_needs_python(tmp_path: Path) -> None:
    res = _run("--release", "0.5.22", "--probe")
    assert res.exit_code == 2 and "--probe needs --python" in res.stderr
    res = _run("--site-packages", str(tmp_path), "--python", "python3")
    assert res.exit_code == 2 and "give one of" in res.stderr  # the pair is only for --probe


@pytest.mark.slow
@pytest.mark.wheels
def test_probe_runs_the_installed_admission_code() -> None:
    from tests.assets.real_sglang import cpu_env_or_skip

    env = cpu_env_or_skip("0.5.21")
    rc, doc = _json("--site-packages", str(env.site_packages), "--python", env.python, "--probe")
    assert rc == 1 and doc["target"]["missing_correctness"] == ["ack-generations"]
    assert "behaviour" in doc["target"]["methods"]
    door = next(f for f in doc["findings"] if f["check"] == "pr-38935")
    assert door["outcome"] == "passed" and "by behaviour" in door["summary"]
    assert any(
        e["field"] == "by_behaviour" and e["value"].startswith("present: admission probe") for e in door["evidence"]
    )


# --- --python: a whole command line, the scan program on its stdin ------------------------------


@pytest.mark.wheels
def test_python_command_line_reads_the_remote_code() -> None:
    inner = f"cd / && exec env -i PATH=/usr/bin:/bin PYTHONPATH={wheel('0.5.20')} python3"
    rc, doc = _json("--python", f"sh -c '{inner}'")
    assert rc == 1 and doc["target"]["release"] == "0.5.20"
    assert "pr-38935" in doc["target"]["missing_correctness"]
    door = next(f for f in doc["findings"] if f["check"] == "pr-38935")
    assert "by source" in door["summary"]


@pytest.mark.parametrize(
    "command, message",
    [
        ("sh -c 'cat >/dev/null; sleep 60'", "no answer within 2 s"),
        ("sh -c 'cat >/dev/null; echo not json'", "did not answer with a kvgate code scan"),
        ("sh -c 'exit 7'", "exited 7"),
    ],
)
def test_python_command_that_hangs_or_answers_garbage_exits_4(command: str, message: str) -> None:
    res = _run("--python", command, "--scan-timeout", "2")
    assert res.exit_code == 4 and message in res.stderr and repr(command) in res.stderr


def test_probe_needs_a_local_interpreter() -> None:
    res = _run("--python", "kubectl exec -i pod -- python3", "--probe")
    assert res.exit_code == 2 and "local interpreter" in res.stderr


def test_the_backport_remedy_is_a_command_that_parses() -> None:
    """`--to` takes a release (not a tree): the fix text names one that has a series, and the target flag."""
    rc, doc = _json("--release", "0.5.20")
    remedies = {f["remedy"] for f in doc["findings"] if f["remedy"] and "kvgate backport" in f["remedy"]}
    assert remedies and all("<sglang tree>" not in r for r in remedies)
    assert all("kvgate backport --release RELEASE --site-packages PATH" in r and "v0.5.20" in r for r in remedies)
