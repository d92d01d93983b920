"""Fast checks of the series data and the strict diff applier (no wheels needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.backport.diffapply import PatchApplyError, apply, parse
from kvgate.catalogue.scanprog import MARKER_PREFIX
from kvgate.catalogue.series import available, load_series, normalise_release
from kvgate.errors import UsageError

SERIES = {
    "0.5.20": [
        "kvgate-admission-door",
        "kvgate-deferred-release-default",
        "kvgate-preserve-abort-ack",
        "kvgate-ack-fanout",
        "kvgate-force-arm-on-failure",
        "kvgate-ack-generations",
        "kvgate-verify-handoff-coverage",
    ],
    "0.5.19": [
        "kvgate-admission-door",
        "kvgate-deferred-release-default",
        "kvgate-retire-aborted-results",
        "kvgate-preserve-abort-ack",
        "kvgate-ack-fanout",
        "kvgate-force-arm-on-failure",
        "kvgate-ack-generations",
        "kvgate-verify-handoff-coverage",
    ],
}


@pytest.mark.parametrize("release", sorted(SERIES))
def test_manifest_lists_the_agreed_patch_ids_in_order(release: str) -> None:
    s = load_series(f"v{release}")
    assert s.base_release == release
    assert [p.id for p in s.patches] == SERIES[release]
    assert [p.id for p in s.select(False)] == SERIES[release][:-1]  # hardening is opt-in and last
    assert s.select(True)[-1].optional


@pytest.mark.parametrize("release", sorted(SERIES))
def test_every_patch_marks_every_file_it_changes(release: str) -> None:
    for p in load_series(release).patches:
        diffs = {d.path: d for d in parse(p.diff_text())}
        assert set(diffs) == {f.path for f in p.files}, p.id
        for path, d in diffs.items():
            added = "".join(line for _, _, new in d.hunks for line in new)
            assert f"{MARKER_PREFIX}{p.id}" in added, f"{p.id} adds no marker to {path}"
        assert p.stands_in_for and p.fixes and p.signatures
        added_all = "".join(line for d in diffs.values() for _, _, new in d.hunks for line in new)
        for sig in p.signatures:
            assert sig in added_all, f"{p.id}: signature {sig!r} is not added by the patch"


@pytest.mark.parametrize("release", sorted(SERIES))
def test_each_files_code_signatures_are_what_the_patch_adds_to_that_file(release: str) -> None:
    """kvgate fixes recognises a backport by these strings: each must be added to its own file, not a comment."""
    for p in load_series(release).patches:
        diffs = {d.path: d for d in parse(p.diff_text())}
        for f in p.files:
            old = {line for _, old_lines, _ in diffs[f.path].hunks for line in old_lines}
            added = [line for _, _, new in diffs[f.path].hunks for line in new if line not in old]
            assert f.code, (p.id, f.path)
            for c in f.code:
                assert any(c in line and not line.lstrip().startswith("#") for line in added), (p.id, f.path, c)


def test_only_releases_with_a_series_are_offered() -> None:
    assert set(available()) >= {"0.5.19", "0.5.20"}
    with pytest.raises(UsageError, match="no backport series for v0.5.21"):
        load_series("v0.5.21")  # 0.5.21+ already carry the fixes: no series, nothing to patch
    with pytest.raises(UsageError):
        normalise_release("latest")
    assert normalise_release("v0.5.20") == normalise_release("0.5.20") == "0.5.20"


def test_strict_applier_applies_and_refuses_drift() -> None:
    old = "a\nb\nc\nd\n"
    diff = parse("--- a/x.py\n+++ b/x.py\n@@ -2,2 +2,3 @@\n b\n+# kvgate-backport: t\n c\n")
    assert apply(old, diff[0]) == "a\nb\n# kvgate-backport: t\nc\nd\n"
    with pytest.raises(PatchApplyError):
        apply("a\nB\nc\nd\n", diff[0])


def test_broken_manifest_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "v0.5.20").mkdir()
    (tmp_path / "v0.5.20" / "manifest.yaml").write_text("base_release: 0.5.20\npatches:\n- id: x\n  file: gone.patch\n")
    with pytest.raises(UsageError, match="invalid manifest"):
        load_series("0.5.20", root=tmp_path)


def test_a_manifest_field_nothing_reads_is_refused(tmp_path: Path) -> None:
    series = tmp_path / "v0.5.20"
    series.mkdir()
    (series / "0001.patch").write_text("")
    (series / "manifest.yaml").write_text(
        "base_release: 0.5.20\npatches:\n- id: x\n  file: 0001.patch\n  title: t\n  gate: lifetime\n  files: []\n"
    )
    with pytest.raises(UsageError, match=r"patch x: unknown key\(s\) gate"):
        load_series("0.5.20", root=tmp_path)
