"""Issue 6's "done when", end to end through the real CLI (in process) on the real 0.5.20 source."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.backport.cpuenv import CpuEnv
from kvgate.cli import app
from kvgate.gates.defenses import DefenseInputs
from kvgate.results.findings import Finding, Outcome

from .conftest import tree_digest

pytestmark = [pytest.mark.slow, pytest.mark.wheels]
runner = CliRunner()
REJECT = "Input length (8 tokens) exceeds the maximum allowed length (4 tokens)."


def test_repo_apply_verify_fixes_and_no_op(checkout: Callable[[str], Path], cpu_envs: Callable[[str], CpuEnv]) -> None:
    cpu_envs("0.5.20")  # --verify runs the probe in the cached CPU environment
    repo = checkout("0.5.20")
    unpatched = runner.invoke(app, ["backport", "--release", "v0.5.20", "--repo", str(repo), "--verify", "-f", "json"])
    assert unpatched.exit_code == 1, unpatched.output  # not applied, and the real doors admit the rejection
    assert json.loads(unpatched.stdout)["target"]["probe_status"] == "ADMITTED"

    applied = runner.invoke(app, ["backport", "--release", "v0.5.20", "--repo", str(repo)])
    assert applied.exit_code == 0, applied.output
    verify = runner.invoke(app, ["backport", "--release", "v0.5.20", "--repo", str(repo), "--verify", "-f", "json"])
    assert verify.exit_code == 0, verify.output
    doc = json.loads(verify.stdout)
    assert doc["target"]["probe_status"] == "RETIRED"
    # Issue 23: the opt-in patch that was not applied is info, never PASS; and every long step says so.
    opt_in = [f for f in doc["findings"] if f["summary"].startswith("not applied (opt-in")]
    assert opt_in and all(f["outcome"] == "info" for f in opt_in), opt_in
    assert "preparing the CPU environment of sglang 0.5.20" in verify.stderr
    assert "running sglang's admission code on CPU" in verify.stderr
    assert doc["target"]["client_error"]["status_code"] == 400
    assert doc["target"]["client_error"]["message"] == REJECT

    fixes = runner.invoke(app, ["fixes", "--repo", str(repo), "--format", "json"])
    found = {f["check"]: f["summary"] for f in json.loads(fixes.stdout)["findings"]}
    for patch_id in ("kvgate-admission-door", "kvgate-deferred-release-default"):
        assert found[patch_id].startswith("present"), (patch_id, found.get(patch_id))

    again = runner.invoke(app, ["backport", "--release", "v0.5.20", "--repo", str(repo)])
    assert again.exit_code == 0 and "already applied" in again.stdout


def test_site_packages_apply_verify_with_hardening_and_revert(site: Callable[[str], CpuEnv]) -> None:
    env = site("0.5.20")
    root = env.site_packages
    pristine = tree_digest(root)
    args = ["backport", "--release", "v0.5.20", "--site-packages", str(root)]
    assert runner.invoke(app, [*args, "--with-hardening"]).exit_code == 0
    verify = runner.invoke(app, [*args, "--verify", "--python", env.python, "-f", "json"])
    assert verify.exit_code == 0, verify.output
    checks = {f["check"]: f["outcome"] for f in json.loads(verify.stdout)["findings"]}
    assert checks["admission"] == "passed" and checks["handoff-coverage"] == "passed"
    again = runner.invoke(app, [*args, "--with-hardening"])
    assert again.exit_code == 0 and "already applied" in again.stdout
    assert runner.invoke(app, [*args, "--revert"]).exit_code == 0
    assert tree_digest(root) == pristine


def test_v0_5_19_site_verify_runs_all_three_probes(site: Callable[[str], CpuEnv]) -> None:
    env = site("0.5.19")
    args = ["backport", "--release", "v0.5.19", "--site-packages", str(env.site_packages)]
    assert runner.invoke(app, [*args, "--with-hardening"]).exit_code == 0
    verify = runner.invoke(app, [*args, "--verify", "--python", env.python, "-f", "json"])
    assert verify.exit_code == 0, verify.output
    checks = {f["check"]: f["outcome"] for f in json.loads(verify.stdout)["findings"]}
    assert checks["admission"] == checks["retire-aborted-results"] == checks["handoff-coverage"] == "passed"
    assert all(checks[p] == "passed" for p in ("kvgate-admission-door", "kvgate-retire-aborted-results"))


@pytest.mark.parametrize("release", ["0.5.20", "0.5.19"])
def test_issue_21_backported_install_passes_fixes_and_markers_alone_do_not(
    release: str, site: Callable[[str], CpuEnv], tmp_path: Path
) -> None:
    """Issue 21: after the series, every correctness fix is present or stood in for; the comment markers
    alone bring none of them."""
    import shutil

    from kvgate.catalogue.series import load_series

    root = site(release).site_packages
    markers = tmp_path / "markers-only"
    shutil.copytree(root, markers, symlinks=True)
    assert runner.invoke(app, ["fixes", "--site-packages", str(root)]).exit_code == 1
    applied = runner.invoke(app, ["backport", "--release", f"v{release}", "--site-packages", str(root)])
    assert applied.exit_code == 0, applied.output
    fixes = runner.invoke(app, ["fixes", "--site-packages", str(root), "--format", "json"])
    assert fixes.exit_code == 0, fixes.output
    found = {f["check"]: f["summary"] for f in json.loads(fixes.stdout)["findings"]}
    for fix, bp in (
        ("pr-40645", "kvgate-preserve-abort-ack"),
        ("pr-41402", "kvgate-ack-fanout"),
        ("pr-41404", "kvgate-force-arm-on-failure"),
        ("ack-generations", "kvgate-ack-generations"),
    ):
        assert f"by kvgate backport {bp}, code verified" in found[fix], found[fix]
    for patch in load_series(release).select(False):
        for f in patch.files:
            p = markers / f.site_path
            p.write_text(p.read_text(encoding="utf-8") + f"\n# kvgate-backport: {patch.id}\n", encoding="utf-8")
    tampered = runner.invoke(app, ["fixes", "--site-packages", str(markers), "--format", "json"])
    assert tampered.exit_code == 1
    doc = json.loads(tampered.stdout)
    assert "kvgate-ack-generations" in doc["target"]["tampered_backports"]
    # The backported tree runs with deferred release on by default: a worker that exposes its env without
    # setting the variable passes defenses.deferred-release when its code was read (found on the real
    # backported 0.5.20 pair, tests/real/test_backport_real.py); the release's own default (off) does not.
    from dataclasses import replace

    from kvgate.catalogue import assess_installed
    from kvgate.catalogue.source import from_site_packages
    from kvgate.gates.defenses import run_defenses_gate
    from tests.gates.test_defenses import P0

    def deferred(node: DefenseInputs) -> Finding:
        return next(f for f in run_defenses_gate([node]) if f.check == "deferred-release")

    node = replace(P0, version=release, env_vars={"OTHER": "1"})
    for tree, outcome in ((root, Outcome.PASSED), (markers, Outcome.FAILED)):
        f = deferred(replace(node, fixes=assess_installed(from_site_packages(tree))))
        assert f.outcome is outcome, (tree.name, f.summary, f.evidence)
    assert deferred(node).outcome is Outcome.FAILED  # the version string's default
