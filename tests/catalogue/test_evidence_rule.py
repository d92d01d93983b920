"""Code evidence outranks labels, both ways: the one rule of `combine.decide`, as a table over every method
pair, and the issue's case on a real git checkout (a vendored sglang with its `_version.py` whose HEAD
reverts a fix)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.catalogue import Presence, assess_checkout, load_catalogue
from kvgate.catalogue.assess import assess, correctness_verdict, to_findings
from kvgate.catalogue.combine import CODE_METHODS, combine
from kvgate.catalogue.model import METHODS, Detection
from kvgate.cli import app
from kvgate.results.findings import Outcome
from tests.catalogue.helpers import commit_release, copy_signature_tree, init_repo

FIX = "pr-38935"  # a correctness fix with signatures in four files
P, A, U = Presence.PRESENT, Presence.ABSENT, Presence.UNKNOWN
LABELS = [m for m in METHODS if m not in CODE_METHODS]
CODE = [m for m in METHODS if m in CODE_METHODS]
STRENGTH = {m: i for i, m in enumerate(METHODS)}


def _status(*answers: tuple[str, Presence]):  # type: ignore[no-untyped-def]
    cat = load_catalogue()
    dets = [Detection(FIX, method, presence, (f"{method} says {presence.value}",)) for method, presence in answers]
    return next(s for s in combine(cat, dets) if s.fix.id == FIX)


def test_the_methods_are_code_or_label() -> None:
    assert LABELS == ["version"] and set(CODE) == {"git", "source", "behaviour"}


@pytest.mark.parametrize("code_method", CODE)
@pytest.mark.parametrize("code", [A, U, P], ids=["code-gone", "code-unknown", "code-present"])
@pytest.mark.parametrize("label", [P, A], ids=["label-present", "label-absent"])
def test_code_against_label(code_method: str, code: Presence, label: Presence) -> None:
    """code says gone / unknown / present x label says present / absent: the code's answer, always."""
    s = _status((code_method, code), ("version", label))
    assert s.presence is code, (code_method, code, label, s.how())
    assert s.decided_by == (code_method if code is not U else None)
    if code is not P:
        assert s.presence is not P
    a = assess([Detection(FIX, code_method, code), Detection(FIX, "version", label)], target="t", release="0.5.23")
    verdict = correctness_verdict(a)
    finding = next(f for f in to_findings(a) if f.check == FIX)
    if code is A:
        assert verdict.outcome is Outcome.FAILED and finding.outcome is Outcome.FAILED
    elif code is U:  # inconclusive at best, never a pass, and blocking whatever the strictness
        assert verdict.outcome is Outcome.INCONCLUSIVE and verdict.blocking
        assert finding.outcome is Outcome.INCONCLUSIVE and finding.blocking
        if label is P:
            assert "a label, never evidence over the code" in finding.summary
    else:
        assert finding.outcome is Outcome.PASSED


@pytest.mark.parametrize("weaker,stronger", list(itertools.combinations(CODE, 2)))
@pytest.mark.parametrize("label", [None, P, A])
def test_code_against_code_with_and_without_a_label(weaker: str, stronger: str, label: Presence | None) -> None:
    """Two code methods (and a label or none): the strongest code method that knows decides; present only
    where no stronger code method says gone, never where every code method says gone or cannot tell."""
    assert STRENGTH[weaker] < STRENGTH[stronger]
    for w, st in itertools.product([A, U, P], repeat=2):
        answers = [(weaker, w), (stronger, st)] + ([("version", label)] if label else [])
        s = _status(*answers)
        expected = st if st is not U else w
        assert s.presence is expected, (answers, s.how())
        if P not in (w, st):
            assert s.presence is not P, answers
        if st is A:
            assert s.presence is A, answers


@pytest.mark.parametrize("label", [P, A, U])
def test_a_label_alone_decides_only_where_no_code_was_read(label: Presence) -> None:
    s = _status(("version", label))
    assert s.presence is label and s.decided_by == ("version" if label is not U else None)


# -- the case: a git checkout whose HEAD reverts a fix, with the release's _version.py -------------
REVERTED = {  # the fix's own lines, as a revert would remove them (real files of the release otherwise)
    "srt/disaggregation/utils.py": "def is_unadmitted_reject(",
    "srt/disaggregation/prefill.py": "if is_unadmitted_reject(req):",
    "srt/disaggregation/decode.py": "and is_unadmitted_reject(req)",
    "srt/managers/scheduler.py": "def retire_unadmitted_request(",
}


def _revert_fix(package: Path) -> None:
    for rel, needle in REVERTED.items():
        f = package / rel
        text = f.read_text(encoding="utf-8")
        assert needle in text, rel
        f.write_text(text.replace(needle, "# reverted: " + needle.replace("(", "_")), encoding="utf-8")


@pytest.mark.wheels
def test_a_checkout_that_reverts_a_fix_never_passes_on_its_version_string(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "sglang")
    commit_release(repo, "0.5.23", "[PD] Do not admit intake-rejected requests to a PD handoff (#38935)")
    runner = CliRunner()
    clean = runner.invoke(app, ["fixes", "--repo", str(tmp_path / "sglang"), "--format", "json"])
    assert clean.exit_code == 0, clean.output  # the release itself passes: the case turns on the revert
    package = tmp_path / "sglang" / "python" / "sglang"
    assert (package / "_version.py").is_file() or (package / "version.py").is_file()
    _revert_fix(package)
    repo.git.add("-A")
    repo.git.commit("-q", "-m", "Revert the admission door for a local experiment")
    a = assess_checkout(tmp_path / "sglang")
    s = a.status(FIX)
    assert a.release == "0.5.23" and s.presence is Presence.UNKNOWN, s.how()
    assert {d.method: d.presence for d in s.detections} == {"git": U, "version": P}
    res = runner.invoke(app, ["fixes", "--repo", str(tmp_path / "sglang"), "--format", "json"])
    assert res.exit_code == 3, res.output
    finding = next(f for f in json.loads(res.stdout)["findings"] if f["check"] == FIX)
    assert finding["outcome"] == "inconclusive" and finding["blocking"]
    assert "reverted or refactored" in json.dumps(finding["evidence"])
    no_strict = runner.invoke(app, ["fixes", "--repo", str(tmp_path / "sglang"), "--no-strict"])
    assert no_strict.exit_code != 0, no_strict.output  # an unknown correctness fix blocks even then
    # The same files read as an installation: the source method sees the fix gone and fails.
    site = tmp_path / "site"
    shutil.copytree(package, site / "sglang")
    installed = runner.invoke(app, ["fixes", "--site-packages", str(site), "--format", "json"])
    assert installed.exit_code == 1, installed.output
    # And a tree that only carries the version file of the release (the code of the reverted files read
    # by the source method) agrees: absent, not present by its label.
    copy_signature_tree("0.5.23", tmp_path / "fresh" / "sglang")
    _revert_fix(tmp_path / "fresh" / "sglang")
    fresh = runner.invoke(app, ["fixes", "--site-packages", str(tmp_path / "fresh")])
    assert fresh.exit_code == 1, fresh.output
