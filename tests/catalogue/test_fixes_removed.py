"""The fixes every verified release already carries (upstream-2026-12.md): on a tree copied from the
REAL wheel with one fix's code taken out (what a fork or vendor build that lacks it looks like), the
code scan says that fix is missing, and `kvgate fixes` fails where the fix is a correctness fix.

The edits remove code lines (a call, an assignment, a definition's line); nothing is planted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgate.catalogue import Presence, assess_installed
from kvgate.catalogue.source import from_site_packages
from kvgate.cli import app
from tests.catalogue.helpers import copy_signature_tree

pytestmark = pytest.mark.wheels

D = "srt/disaggregation/"
#: (entry, release copied, backend, [(file, regex of the code lines removed)]). The regex removes every
#: line it matches; the copy must change, so a signature that moved is noticed.
REMOVALS: list[tuple[str, str, str | None, list[tuple[str, str]]]] = [
    ("pr-17430", "0.5.22", None, [(D + "decode.py", r"elif actual_room != expected_room:")]),
    ("pr-27374", "0.5.21", None, [(D + "decode.py", r"self\.metadata_buffers\.bootstrap_room\[idx\] = 0")]),
    ("pr-27374", "0.5.23", None, [(D + "utils.py", r"self\.bootstrap_room\[idx\] = 0")]),
    ("pr-27372", "0.5.20", "mooncake", [(D + "mooncake/conn.py", r'if room == "ABORT":')]),
    ("pr-27372", "0.5.23", "mooncake", [(D + "mooncake/conn.py", r"def _handle_abort_notification\(")]),
    ("pr-30352", "0.5.19", "nixl", [(D + "nixl/conn.py", r"if self\._handle_abort_notification\(waiting_req")]),
    ("pr-30352", "0.5.19", "nixl", [(D + "nixl/conn.py", r"if self\.request_status\.get\(bootstrap_room\) == KVPoll")]),
    ("pr-30352", "0.5.22", "nixl", [(D + "common/conn.py", r"^        if current == KVPoll\.Failed:")]),
    ("pr-39357", "0.5.23", None, [("srt/managers/schedule_batch.py", r'"routed_dp_rank": self\.disagg_prefill')]),
    (
        "unified-pool-transfer",
        "0.5.21",
        None,
        [(D + "utils.py", r"or scheduler\.disagg_decode_prealloc_queue\.has_published_destinations")],
    ),
    ("unified-pool-transfer", "0.5.19", None, [(D + "prefill.py", r"translate_kv_indices_for_transfer\(")]),
    ("zmq-send-lock", "0.5.20", None, [(D + "common/conn.py", r"with self\._socket_send_locks\[endpoint\]:")]),
    ("open-40731", "0.5.22", None, [("srt/managers/schedule_batch.py", r"def build_rebootstrap_payload\(self\)")]),
]


def _remove(pkg: Path, rel: str, pattern: str) -> None:
    path = pkg / rel
    text = path.read_text(encoding="utf-8")
    rx = re.compile(pattern)
    kept = [line for line in text.splitlines(keepends=True) if not rx.search(line)]
    assert len(kept) < len(text.splitlines()), f"{rel}: nothing matched {pattern!r} (the code moved?)"
    path.write_text("".join(kept), encoding="utf-8")


@pytest.mark.parametrize(
    ("fix_id", "release", "backend", "edits"), REMOVALS, ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(REMOVALS)]
)
def test_removing_a_fixs_code_reads_as_missing(
    tmp_path: Path, fix_id: str, release: str, backend: str | None, edits: list[tuple[str, str]]
) -> None:
    site = tmp_path / "site"
    pkg = copy_signature_tree(release, site / "sglang")
    before = assess_installed(from_site_packages(site), backend=backend)
    assert before.status(fix_id).presence is Presence.PRESENT  # the real wheel carries it
    for rel, pattern in edits:
        _remove(pkg, rel, pattern)
    after = assess_installed(from_site_packages(site), backend=backend)
    s = after.status(fix_id)
    assert s.presence is Presence.ABSENT and s.decided_by == "source", (fix_id, s.detections)
    assert s.disagreement  # the version string says present; the code read wins
    required = s.fix.is_correctness_for(backend)
    assert (s in after.missing_correctness()) is required


def test_kvgate_fixes_fails_a_build_that_lacks_a_correctness_fix(tmp_path: Path) -> None:
    """The CLI on a 0.5.22 tree without the ZMQ send lock: exit 1, the entry named absent; the
    untouched tree passes."""
    site = tmp_path / "site"
    pkg = copy_signature_tree("0.5.22", site / "sglang")
    runner = CliRunner()
    ok = runner.invoke(app, ["fixes", "--site-packages", str(site), "--format", "json"])
    assert ok.exit_code == 0, ok.stdout
    _remove(pkg, D + "common/conn.py", r"with self\._socket_send_locks\[endpoint\]:")
    res = runner.invoke(app, ["fixes", "--site-packages", str(site), "--format", "json"])
    assert res.exit_code == 1, res.stdout
    doc = json.loads(res.stdout)
    lock = next(f for f in doc["findings"] if f["check"] == "zmq-send-lock")
    assert lock["outcome"] == "failed" and lock["summary"].startswith("absent: zmq-send-lock")


def test_open_problems_are_listed_never_passed(tmp_path: Path) -> None:
    """Every release still has the known open problems: listed as info ("still open here"), never a
    pass; a tree without the affected code reads "not affected"."""
    site = tmp_path / "site"
    pkg = copy_signature_tree("0.5.23", site / "sglang")
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["fixes", "--site-packages", str(site), "--format", "json"]).stdout)
    opens = {f["check"]: f for f in doc["findings"] if f["check"].startswith("open-")}
    assert set(opens) == {"open-36707", "open-40731", "open-40125", "open-29978"}
    for f in opens.values():
        assert f["outcome"] == "info" and f["summary"].startswith("still open here: #"), f
    _remove(pkg, "srt/managers/schedule_batch.py", r"def build_rebootstrap_payload\(self\)")
    doc = json.loads(runner.invoke(app, ["fixes", "--site-packages", str(site), "--format", "json"]).stdout)
    f = next(f for f in doc["findings"] if f["check"] == "open-40731")
    assert f["outcome"] == "info" and f["summary"].startswith("not affected: #40731")
