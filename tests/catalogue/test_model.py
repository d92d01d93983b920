"""The catalogue data: every record the issue names, honest about what is uncertain."""

from __future__ import annotations

import copy
from importlib import resources

import pytest
import yaml

from kvgate.catalogue import load_catalogue
from kvgate.catalogue.model import CatalogueError, parse_catalogue
from kvgate.catalogue.signatures import glob_prefix, glob_regex
from tests.catalogue.helpers import EXPECTED


def _doc() -> dict:
    return yaml.safe_load(resources.files("kvgate.catalogue").joinpath("fixes.yaml").read_text())


def test_every_named_record_has_an_entry() -> None:
    cat = load_catalogue()
    numbers = {f.number for f in cat.fixes}
    for n in (30233, 30325, 35049, 35360, 36612, 36988, 37454, 38704, 38935, 39500, 40645, 41023, 41402, 41404):
        assert n in numbers, n
    ids = {f.id for f in cat.fixes}
    assert {"checksum-safety", "kv-canary"} <= ids
    assert set(EXPECTED) == ids, "the presence table in the tests covers every entry"


def test_entries_state_no_more_than_is_known() -> None:
    cat = load_catalogue()
    for fid in ("pr-41402", "pr-41404", "pr-41023"):
        f = cat.get(fid)
        assert f.state_evidence == "3P" and any(u.startswith("3P") for u in f.uncertain), fid
    assert cat.get("pr-41404").state == "not-established"
    assert cat.get("checksum-safety").state == "not-established" and cat.get("checksum-safety").uncertain
    assert cat.get("ack-generations").uncertain
    for fid in ("pr-30325", "pr-38704"):
        assert cat.get(fid).state in ("open", "not-merged") and cat.get(fid).first_release is None


def test_failure_classes_and_first_releases() -> None:
    cat = load_catalogue()
    assert cat.get("pr-38935").failure_class == "admission"
    assert cat.get("pr-36988").failure_class == "abort-cleanup"
    assert cat.get("pr-39500").failure_class == "detection"
    assert cat.get("pr-40645").failure_class == "page-lifetime"
    assert str(cat.get("pr-36988").first_release) == "0.5.20"
    assert str(cat.get("pr-38935").first_release) == "0.5.21"
    assert cat.get("pr-35049").first_release_bound == "at-or-before"


def test_correctness_set_is_the_documented_one() -> None:
    cat = load_catalogue()
    base = {"pr-35049", "pr-36988", "pr-38935", "pr-40645", "pr-41402", "pr-41404", "pr-41023", "ack-generations"}
    base |= {"pr-17430", "zmq-send-lock"}  # in every verified release; a fork without them fails
    assert set(cat.correctness_ids()) == base
    assert set(cat.correctness_ids("mooncake")) == base | {"pr-27372"}
    assert set(cat.correctness_ids("nixl")) == base | {"pr-30352"}
    assert set(cat.correctness_ids("mori")) == base | {"mori-deferred-release"}
    # open problems never gate: their signatures are the affected code, not a fix
    assert not any(f.correctness for f in cat.fixes if f.is_open_problem)


def test_backports_stand_in_for_their_upstream_fix() -> None:
    cat = load_catalogue()
    pairs = {b.id: b.backports for b in cat.backports()}
    assert pairs == {
        "kvgate-admission-door": "pr-38935",
        "kvgate-deferred-release-default": "pr-41023",
        "kvgate-retire-aborted-results": "pr-36988",
        "kvgate-verify-handoff-coverage": "pr-38704",
        "kvgate-preserve-abort-ack": "pr-40645",
        "kvgate-ack-fanout": "pr-41402",
        "kvgate-force-arm-on-failure": "pr-41404",
        "kvgate-ack-generations": "ack-generations",
    }
    for b in cat.backports():  # recognised by their series' code signatures, never by a marker here
        assert b.signatures == ()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["fixes"][0].update(signatures=[]), "no signatures"),
        (lambda d: d["fixes"][0].update(signatures=[{"file": "x.py", "regex": "("}]), "bad regex"),
        (lambda d: d["fixes"][0].update(failure_class="vibes"), "failure_class"),
        (lambda d: d["fixes"][-1].update(backports="pr-99999"), "backports unknown"),
        (lambda d: d["fixes"].append(copy.deepcopy(d["fixes"][0])), "duplicate id"),
        (lambda d: d.update(schema=2), "schema"),
    ],
)
def test_invalid_catalogue_is_rejected(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = _doc()
    mutate(doc)
    with pytest.raises(CatalogueError, match=message):
        parse_catalogue(doc)


def test_glob_translation() -> None:
    rx = glob_regex("srt/disaggregation/**/*.py")
    assert rx.match("srt/disaggregation/prefill.py")
    assert rx.match("srt/disaggregation/common/conn.py")
    assert not rx.match("srt/managers/scheduler.py")
    assert not rx.match("srt/disaggregation/prefill.pyc")
    assert glob_regex("**/*.py").match("version.py")
    assert glob_prefix("srt/disaggregation/**/*.py") == "srt/disaggregation/"
    assert glob_prefix("**/*.py") == ""
