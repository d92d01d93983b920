"""Method 1: what a release string can and cannot tell."""

from __future__ import annotations

import pytest

from kvgate.catalogue import Presence, load_catalogue, parse_release
from kvgate.catalogue.version import detect_by_version
from kvgate.errors import UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.upstream.releases import RELEASES
from tests.catalogue.helpers import EXPECTED


def _by_version(raw: str) -> dict[str, Presence]:
    return {k: d.presence for k, d in detect_by_version(load_catalogue(), parse_release(raw)).items()}


def test_parse_final() -> None:
    r = parse_release("0.5.20")
    assert str(r.version) == "0.5.20" and r.is_final and r.commit is None and r.kind == "final release"


def test_parse_dev_with_commit() -> None:
    r = parse_release("0.5.21.dev12+g8f3d694")
    assert r.version.is_devrelease and r.version.dev == 12
    assert str(r.base) == "0.5.21" and r.commit == "8f3d694" and not r.is_final


def test_parse_post() -> None:
    r = parse_release("0.5.20.post1")
    assert r.version.is_postrelease and str(r.base) == "0.5.20" and r.kind == "post/local build"


def test_local_without_commit_has_no_commit() -> None:
    r = parse_release("0.5.22+cu128")
    assert r.commit is None and r.kind == "post/local build"


@pytest.mark.parametrize("garbage", ["garbage", "", "0.5.x", "latest", "0..5"])
def test_garbage_is_a_usage_error(garbage: str) -> None:
    with pytest.raises(UsageError, match="not a PEP 440 version") as exc:
        parse_release(garbage)
    assert exc.value.exit_status is ExitStatus.USAGE_ERROR


@pytest.mark.parametrize("release", RELEASES)
def test_verified_releases_match_the_presence_table(release: str) -> None:
    got = _by_version(release)
    for fid, releases in EXPECTED.items():
        if fid.startswith("kvgate-"):
            assert got[fid] is Presence.UNKNOWN, "a version string cannot show backports"
            continue
        want = Presence.PRESENT if release in releases else Presence.ABSENT
        assert got[fid] is want, (release, fid)


def test_dev_build_knows_only_what_came_before() -> None:
    got = _by_version("0.5.21.dev12+g8f3d694")
    assert got["pr-36988"] is Presence.PRESENT  # in 0.5.20
    assert got["pr-38935"] is Presence.UNKNOWN  # first in 0.5.21: a dev build may predate it
    assert got["ack-generations"] is Presence.ABSENT  # not even in 0.5.21 final
    ev = detect_by_version(load_catalogue(), parse_release("0.5.21.dev12+g8f3d694"))["pr-38935"].evidence
    assert any("8f3d694" in e for e in ev)


def test_post_release_may_carry_backports() -> None:
    got = _by_version("0.5.20.post1")
    assert got["pr-36988"] is Presence.PRESENT
    assert got["pr-38935"] is Presence.UNKNOWN
    assert got["pr-38704"] is Presence.UNKNOWN


def test_unverified_releases_are_unknown_or_inferred() -> None:
    cat = load_catalogue()
    for raw in ("0.5.24", "0.6.0", "0.6.0rc1", "0.5.24.dev3+gabc1234", "0.6.0.post2"):
        newer = detect_by_version(cat, parse_release(raw))
        for fid, d in newer.items():
            fix = cat.get(fid)
            if fix.is_backport or fix.first_release is None:
                assert d.presence is Presence.UNKNOWN and not d.weak, (raw, fid)
            else:  # in 0.5.23: assumed by release order, and marked weak
                assert d.presence is Presence.PRESENT and d.weak, (raw, fid)
                assert "assumed present by release order" in d.evidence[0]
    older = _by_version("0.5.10")
    assert older["pr-38935"] is Presence.ABSENT and older["pr-36988"] is Presence.ABSENT
    assert older["pr-35049"] is Presence.UNKNOWN  # first seen "0.5.19 or earlier"
