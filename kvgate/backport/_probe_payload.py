"""Runs INSIDE the interpreter that has the target sglang (no kvgate import): executes sglang's real
PD admission doors and decode commit path on CPU and prints one JSON line prefixed RESULT_TAG.

Real throughout: `Req`, `set_finish_with_abort`, `PrefillBootstrapQueue.add`, `DecodePreallocQueue.add`,
the fake transfer backend's manager/sender/receiver, `ReqToMetadataIdxAllocator`, `MetadataBuffers`,
`DecodeTransferQueue._commit_transfer_to_req` and the `Scheduler` methods the doors call. Only the
objects those methods hand work to (output streamer, beam coordinator, tree cache) are recorders, and
the queues are made with `cls.__new__` and given the attributes their methods read (see
shared/reference/cpu-sglang.md). A missing attribute or import is reported as an error naming it.

Usage: python _probe_payload.py admission|hardening STUB_FILE

Each probe is its own module beside this script (its folder is the first entry of `sys.path` in the
target interpreter): _probe_world.py (the real classes and the recorders), _probe_doors.py (admission),
_probe_commit.py (hardening: the decode commit path), _probe_retire.py (the post-forward result).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from _probe_commit import hardening
from _probe_doors import admission
from _probe_retire import retire_results
from _probe_world import RESULT_TAG, World, _ensure_torchvision, _error

MODES = {"admission": admission, "hardening": hardening, "retire_results": retire_results}


def _run_mode(name: str, world: World) -> dict[str, Any]:
    started = time.monotonic()
    try:
        out = MODES[name](world)
    except Exception as exc:
        out = _error(exc)
    out["duration_s"] = round(time.monotonic() - started, 2)
    return out


def main(argv: list[str]) -> int:
    """argv: MODE STUB_FILE; MODE is one of MODES or "all" (every probe on one import of sglang)."""
    mode, stub_file = argv[1], argv[2]
    started = time.monotonic()
    out: dict[str, Any]
    try:
        stubbed = _ensure_torchvision(stub_file)
        world = World()
        if mode == "all":
            out = {"status": "ok", "suite": {name: _run_mode(name, world) for name in MODES}}
        else:
            out = _run_mode(mode, world)
        out.update(
            version=world.version,
            sglang_path=world.path,
            torchvision_stub=stubbed,
            published_config=world.published_config,
        )
    except Exception as exc:
        out = _error(exc)
    out["import_and_run_s"] = round(time.monotonic() - started, 2)
    sys.stdout.flush()
    print(RESULT_TAG + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
