"""`kvgate check` decides the fixes from the code the workers run, read through --python / --site-packages.

Workers are real loopback HTTP servers reporting a version; the code is the REAL sglang wheel source
(0.5.20, 0.5.22), plus kvgate's real v0.5.20 series applied by `kvgate backport`, reached through
wrapper commands that behave like `kubectl exec -i POD -- python3`: a clean environment (`env -i`),
a shell in between, and a system python3 that has no kvgate installed.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgate.catalogue.series import load_series
from kvgate.cli import app
from kvgate.exitcodes import ExitStatus
from tests.assets import sglang_payloads as P
from tests.catalogue.helpers import add_marker, copy_signature_tree, wheel
from tests.conftest import PayloadServer, Route

pytestmark = pytest.mark.wheels
runner = CliRunner()
PY3 = shutil.which("python3", path="/usr/bin:/bin")


def remote(root: Path, shell: bool = True) -> str:
    """A command like `kubectl exec -i POD -- python3`: a python3 whose only sglang is under `root`."""
    inner = f"env -i PATH=/usr/bin:/bin PYTHONPATH={shlex.quote(str(root))} python3"
    return f"sh -c {shlex.quote('cd / && exec ' + inner)}" if shell else inner


def worker(make: Callable[..., PayloadServer], version: str, mode: str = "prefill") -> PayloadServer:
    return make(
        {
            "/server_info": Route(P.server_info(version, mode=mode, context=1_048_576, pool=2_040_000)),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info(version, mode)),
        }
    )


def check(*args: str) -> tuple[int, dict[str, Any], str]:
    res = runner.invoke(app, ["check", "--quiet", *args, "--format", "json"])
    return res.exit_code, json.loads(res.stdout), res.stderr


def release(doc: dict[str, Any], node_prefix: str = "prefill[0]") -> dict[str, Any]:
    hits = [
        f
        for f in doc["findings"]
        if f["gate"] == "defenses" and f["check"] == "release" and f["node"].startswith(node_prefix)
    ]
    assert len(hits) == 1, doc["findings"]
    return hits[0]


def rows(finding: dict[str, Any]) -> dict[str, Any]:
    return {e["field"]: e["value"] for e in finding["evidence"]}


@pytest.fixture(scope="module")
def patched_0_5_20(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real 0.5.20 source with kvgate's real v0.5.20 series applied by `kvgate backport`."""
    site = tmp_path_factory.mktemp("patched") / "site"
    copy_signature_tree("0.5.20", site / "sglang")
    res = runner.invoke(app, ["backport", "--release", "v0.5.20", "--site-packages", str(site)])
    assert res.exit_code == 0, res.output
    return site


@pytest.fixture(scope="module")
def markers_only_0_5_20(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same real 0.5.20 source with only the series' marker lines added to the files it changes."""
    site = tmp_path_factory.mktemp("markers") / "site"
    pkg = copy_signature_tree("0.5.20", site / "sglang")
    for patch in load_series("0.5.20").select(False):
        for f in patch.files:
            add_marker(pkg, f.site_path[len("sglang/") :], patch.id)
    return site


def test_scan_python_has_no_kvgate() -> None:
    assert PY3 is not None
    import subprocess

    probe = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "python3", "-c", "import kvgate"], capture_output=True, text=True, cwd="/"
    )
    assert probe.returncode != 0  # what remote() runs cannot import kvgate: the scan program needs none of it


@pytest.fixture(scope="module")
def relabelled_0_5_20(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real 0.5.20 source in a fork that calls itself 0.5.22 (its package declares 0.5.22)."""
    site = tmp_path_factory.mktemp("relabelled") / "site"
    pkg = copy_signature_tree("0.5.20", site / "sglang")
    (pkg / "_version.py").write_text('__version__ = version = "0.5.22"\n', encoding="utf-8")
    return site


def test_source_beats_the_version_string(payload_server: Callable[..., PayloadServer], relabelled_0_5_20: Path) -> None:
    # A fork that says 0.5.22 (worker and package agree) while its code is 0.5.20: the code decides.
    w = worker(payload_server, "0.5.22")
    code, doc, _ = check("--prefill-url", w.url, "--python", remote(relabelled_0_5_20))
    assert code == ExitStatus.GATE_FAILED
    f = release(doc)
    assert f["outcome"] == "failed"
    for label in ("#38935", "#40645", "#41402", "#41404", "#41023", "ack-generations"):
        assert label in f["summary"]
    assert f["summary"].startswith("code read (") and "reads as 0.5.22" in f["summary"]
    assert rows(f)["pr-38935"].startswith("absent: #38935") and "by source" in rows(f)["pr-38935"]
    # Control: the same worker running 0.5.22 code passes the release check.
    code, doc, _ = check("--prefill-url", w.url, "--python", remote(wheel("0.5.22"), shell=False))
    f = release(doc)
    assert f["outcome"] == "passed" and "decided by source" in f["summary"]


def test_a_scan_of_another_version_is_not_this_nodes_code(payload_server: Callable[..., PayloadServer]) -> None:
    """The worker reports 0.5.22, the package the command reaches declares 0.5.20: some other package.
    Not evidence for the node (inconclusive naming both), and never a pass, --no-strict included."""
    w = worker(payload_server, "0.5.22")
    for extra in ((), ("--no-strict",), ("--no-strict", "--trust-version")):
        code, doc, _ = check("--prefill-url", w.url, "--python", remote(wheel("0.5.20")), *extra)
        assert code == ExitStatus.INCONCLUSIVE, extra
        f = release(doc)
        assert f["outcome"] == "inconclusive" and f["blocking"]
        assert "declares sglang 0.5.20, but this node reports 0.5.22" in f["summary"]
        assert "{role}-{index}" in f["remedy"]


def test_version_only_is_reported_and_not_counted(payload_server: Callable[..., PayloadServer]) -> None:
    w = worker(payload_server, "0.5.22")
    code, doc, _ = check("--prefill-url", w.url)
    f = release(doc)
    assert f["outcome"] == "inconclusive" and "version string 0.5.22 only, code not read" in f["summary"]
    code, doc, _ = check("--prefill-url", w.url, "--strict")
    assert code == ExitStatus.INCONCLUSIVE
    code, doc, _ = check("--prefill-url", w.url, "--trust-version")
    assert release(doc)["outcome"] == "passed"


def test_backported_0_5_20_reads_as_code_verified(
    payload_server: Callable[..., PayloadServer], patched_0_5_20: Path
) -> None:
    w = worker(payload_server, "0.5.20")
    code, doc, _ = check("--prefill-url", w.url, "--python", remote(patched_0_5_20))
    f = release(doc)
    r = rows(f)
    for fix, bp in (
        ("pr-38935", "kvgate-admission-door"),
        ("pr-41023", "kvgate-deferred-release-default"),
        ("pr-40645", "kvgate-preserve-abort-ack"),
        ("pr-41402", "kvgate-ack-fanout"),
        ("pr-41404", "kvgate-force-arm-on-failure"),
        ("ack-generations", "kvgate-ack-generations"),
    ):
        assert r[fix].startswith("present:") and f"by kvgate backport {bp}, code verified" in r[fix]
    # Every correctness fix is present or stood in for (issue 21): the release check passes.
    assert f["outcome"] == "passed", f["summary"]
    assert "kvgate-ack-generations" in f["summary"]


def test_markers_without_the_code_fail_as_tampered(
    payload_server: Callable[..., PayloadServer], markers_only_0_5_20: Path
) -> None:
    w = worker(payload_server, "0.5.20")
    code, doc, _ = check("--prefill-url", w.url, "--python", remote(markers_only_0_5_20))
    assert code == ExitStatus.GATE_FAILED
    f = release(doc)
    assert f["outcome"] == "failed" and "#38935" in f["summary"]
    assert (
        "tampered or partial backports (marker without the code): kvgate-admission-door, "
        "kvgate-deferred-release-default" in f["summary"]
    )
    assert rows(f)["kvgate-admission-door"].startswith("tampered or partial backport")


def test_profile_code_per_role(payload_server: Callable[..., PayloadServer], tmp_path: Path) -> None:
    p = worker(payload_server, "0.5.20", "prefill")  # reports what its code declares
    d = worker(payload_server, "0.5.22", "decode")
    prof = tmp_path / "code.yaml"
    prof.write_text(
        json.dumps(
            {
                "code": {
                    "prefill": {"python": remote(wheel("0.5.20"))},
                    "decode": {"site_packages": str(wheel("0.5.22"))},
                }
            }
        )
    )
    code, doc, _ = check("--prefill-url", p.url, "--decode-url", d.url, "--profile", str(prof))
    assert release(doc, "prefill")["outcome"] == "failed"
    assert release(doc, "decode")["outcome"] == "passed"


@pytest.mark.parametrize(
    "code_section, key",
    [
        ({"router": {"python": "python3"}}, "code.router"),
        ({"prefill": {"python": "python3", "site_packages": "/"}}, "code.prefill"),
        ({"prefill": {"site_packages": "/no/such/dir"}}, "code.prefill.site_packages"),
        ({"prefill": {"python": "python3", "timeout": 0}}, "code.prefill.timeout"),
    ],
)
def test_bad_code_section_is_a_usage_error(
    payload_server: Callable[..., PayloadServer], tmp_path: Path, code_section: dict[str, Any], key: str
) -> None:
    w = worker(payload_server, "0.5.22")
    prof = tmp_path / "bad.yaml"
    prof.write_text(json.dumps({"code": code_section}))
    code, doc, err = check("--prefill-url", w.url, "--profile", str(prof))
    assert code == ExitStatus.USAGE_ERROR and f"key '{key}'" in err


@pytest.mark.parametrize(
    "wrapper, message",
    [
        ("sh -c 'cat >/dev/null; sleep 60'", "no answer within 2 s (killed)"),
        (
            "sh -c 'cat >/dev/null; echo Defaulted container \"sglang\" out of: sglang, sidecar'",
            "did not answer with a kvgate code scan on stdout (got 'Defaulted container",
        ),
        ("sh -c 'cat >/dev/null; echo error: pod not found >&2; exit 1'", "exited 1; stderr: error: pod not found"),
        (r"""sh -c 'cat >/dev/null; echo "{\"kvgate_scan\": 99}"'""", "the answer is not a kvgate code scan"),
        ("sh -c 'cat >/dev/null; yes garbage'", "printed more than"),
        ("/no/such/kubectl exec -i pod -- python3", "no such program"),
    ],
)
def test_a_failing_scan_command_is_a_transport_error_naming_it(
    payload_server: Callable[..., PayloadServer], wrapper: str, message: str
) -> None:
    w = worker(payload_server, "0.5.22")
    code, doc, _ = check("--prefill-url", w.url, "--python", wrapper, "--scan-timeout", "2")
    assert code == ExitStatus.TRANSPORT_ERROR
    f = release(doc)
    assert f["outcome"] == "error"
    assert f"--python {wrapper!r}" in f["summary"] and message in f["summary"]


def test_scan_flags_are_checked(payload_server: Callable[..., PayloadServer]) -> None:
    w = worker(payload_server, "0.5.22")
    for args in (
        ["--python", "python3", "--site-packages", "/"],
        ["--scan-timeout", "5"],
        ["--python", "sh -c 'unbalanced"],
    ):
        res = runner.invoke(app, ["check", "--quiet", "--prefill-url", w.url, *args])
        assert res.exit_code == ExitStatus.USAGE_ERROR, (args, res.output)


# --- one answer for every version string ------------------------------------------------------

VERDICT = {ExitStatus.PASSED: "passed", ExitStatus.GATE_FAILED: "failed", ExitStatus.INCONCLUSIVE: "inconclusive"}


@pytest.mark.parametrize(
    "version, expected",
    [
        ("0.5.18", "failed"),
        ("0.5.19", "failed"),
        ("0.5.20", "failed"),
        ("0.5.20.post1", "inconclusive"),
        ("0.5.21", "failed"),
        ("0.5.21+fork.1", "inconclusive"),
        ("0.5.22rc1", "inconclusive"),
        ("0.5.22.dev3+gabc1234", "inconclusive"),
        ("0.5.22", "passed"),
        ("v0.5.22", "passed"),
        ("0.5.23", "passed"),
        ("0.5.23.post1", "passed"),
        ("0.5.24", "inconclusive"),
        ("0.6.0", "inconclusive"),
        ("0.6.0.dev1", "inconclusive"),
    ],
)
def test_fixes_and_check_agree_on_every_version_string(
    payload_server: Callable[..., PayloadServer], version: str, expected: str
) -> None:
    w = worker(payload_server, version)
    fixes = runner.invoke(app, ["fixes", "--release", version, "--format", "json"])
    # --no-strict: the label's own verdict, as check --trust-version judges it.
    by_url = runner.invoke(app, ["fixes", "--url", w.url, "--no-strict", "--format", "json"])
    assert VERDICT[ExitStatus(fixes.exit_code)] == VERDICT[ExitStatus(by_url.exit_code)] == expected, fixes.output
    _, doc, _ = check("--prefill-url", w.url, "--trust-version")
    f = release(doc)
    assert f["outcome"] == expected, f["summary"]
    # At the defaults, fixes --url and check agree on the one node: a label alone never passes either.
    plain = runner.invoke(app, ["fixes", "--url", w.url, "--format", "json"])
    _, untrusted, _ = check("--prefill-url", w.url, "--no-probes")
    assert VERDICT[ExitStatus(plain.exit_code)] == release(untrusted)["outcome"], plain.output
    correctness = [
        x
        for x in json.loads(fixes.stdout)["findings"]
        if any(e["field"] == "present" and e["expected"] == "present" for e in x["evidence"])
    ]
    named = {x["check"] for x in correctness if x["outcome"] != "passed"}
    assert {x["check"] for x in correctness} <= set(rows(f))
    assert {x["check"] for x in correctness if not rows(f)[x["check"]].startswith("present")} <= named
    for fix in named:  # what fixes does not pass, check names in its verdict
        label = "#" + fix[3:] if fix.startswith("pr-") else fix
        assert label in f["summary"], (fix, f["summary"])
    for x in json.loads(fixes.stdout)["findings"]:
        if x["check"] in rows(f):
            assert rows(f)[x["check"]] in x["summary"]


def test_a_worker_without_a_version_is_never_a_pass(payload_server: Callable[..., PayloadServer]) -> None:
    info = P.server_info("0.5.22", mode="prefill", context=1_048_576, pool=2_040_000)
    info.pop("version")
    w = payload_server(
        {
            "/server_info": Route(info),
            "/v1/models": Route(P.v1_models(1_048_576)),
            "/model_info": Route(P.model_info("0.5.22", "prefill")),
        }
    )
    assert runner.invoke(app, ["fixes", "--url", w.url]).exit_code == ExitStatus.INCONCLUSIVE
    _, doc, _ = check("--prefill-url", w.url, "--trust-version")
    assert release(doc)["outcome"] == "inconclusive"
