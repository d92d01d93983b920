"""Runs INSIDE the interpreter that has the target sglang (no kvgate import): executes sglang's real
Mooncake PD transfer control plane on CPU and asks, per page-lifetime fix, whether decode frees KV pages
while a prefill write into them may still land. Prints one JSON line prefixed RESULT_TAG.

Real sglang code: `MooncakeKVManager` (prefill and decode roles) with its real ABORT handler thread
(`start_prefill_thread`), ABORT_ACK/status thread (`start_decode_thread`), `transfer_worker` thread,
`add_transfer_request`, `conclude_failure`, the ACK bookkeeping of `CommonKVManager`,
`MooncakeKVReceiver.abort/poll/failure_exception`, `CommonKVSender.clear`, `Scheduler.abort_request`,
`DecodeTransferQueue.pop_transferred/resolve_deferred_releases` and `poll_and_all_reduce` over a real
one-rank gloo group. Managers, receivers and queues are made with `cls.__new__` and given the
attributes their methods read (shared/reference/cpu-sglang.md).

TEST CODE, named as such (the PROBE_* classes and kvgate_probe_* functions):
- ProbeWire / ProbeSocket: the ZMQ links between prefill and decode, in memory (frames logged).
- kvgate_probe_delayed_send_kvcache: stands in for the RDMA write (`send_kvcache`); it blocks on a gate
  (the injected delay), then copies the request's bytes into decode's pages (the late write).
- ProbeKVPool + kvgate_probe_release_kv_cache: decode's page pool and allocator (not under test); a
  freed page goes to the next request at once, like a pool run with a small --max-total-tokens.
Deferred release is switched on (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1, what
kvgate-deferred-release-default makes the default).

Staged by events, never by time (tests must hold on a busy machine): each step (send, write start,
abort, ACK, release) waits for the event before it, which the scenario holds. The write is parked at a
gate inside the patched send until the scenario opens it; `settle` waits until every in-process sglang
thread has handled everything sent to it (it is back waiting on its empty socket or queue), then runs
one decode scheduler round, until a round sends nothing new. Decode's hold timeout (30 s in production)
is set beyond any scenario (HOLD_BOUND_S); a scenario ends a hold that is still waiting, once nothing
else can happen, by expiring its deadline (`expire_holds`): what the real timeout finds. A step that
does not happen within STAGE_BOUND_S (an outer safety net, far above the milliseconds it takes) raises
NotStaged: the scenario is staged again, up to STAGE_TRIES times, and never yields a verdict unstaged
(outcome INCONCLUSIVE, saying what was awaited).

The parts, beside this script (its folder is the first entry of `sys.path` in the target interpreter):
_lifetime_wire.py (the in-memory links and page pool), _lifetime_pair.py (the real control plane,
wired), _lifetime_races.py (a scenario per race and the page oracle).

Usage: python _lifetime_payload.py STUB_FILE
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

os.environ["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] = "1"

from _lifetime_pair import Lifetime  # noqa: E402
from _lifetime_races import SCENARIOS  # noqa: E402
from _lifetime_wire import NotStaged  # noqa: E402
from _probe_world import RESULT_TAG, World, _ensure_torchvision, _error  # noqa: E402

STAGE_TRIES = 3  # how many times a scenario is staged before it is INCONCLUSIVE


def _staged(scenario: Any, lt: Lifetime) -> dict[str, Any]:
    """Run a scenario until it is staged (up to STAGE_TRIES): a race that was not staged is INCONCLUSIVE
    with what was awaited, never a verdict and never an ERROR; an exception of the code is an ERROR."""
    unstaged: list[str] = []
    for attempt in range(1, STAGE_TRIES + 1):
        try:
            out = scenario(lt)
        except NotStaged as exc:
            unstaged.append(str(exc))
            continue
        except Exception as exc:
            return {"outcome": "ERROR", **_error(exc), "not_staged": unstaged}
        return {**out, "staging_tries": attempt, "not_staged": unstaged}
    return {
        "outcome": "INCONCLUSIVE",
        "why": f"the race was not staged in {STAGE_TRIES} tries (rerun the probe); last: {unstaged[-1]}",
        "not_staged": unstaged,
        "staging_tries": STAGE_TRIES,
    }


def main(argv: list[str]) -> int:
    stub_file = argv[1]
    only = argv[2].split(",") if len(argv) > 2 and argv[2] else list(SCENARIOS)
    started = time.monotonic()
    out: dict[str, Any]
    try:
        stubbed = _ensure_torchvision(stub_file)
        w = World()
        lt = Lifetime(w)
        results = {}
        for name in only:
            t = time.monotonic()
            results[name] = _staged(SCENARIOS[name], lt)
            results[name]["duration_s"] = round(time.monotonic() - t, 2)
        out = {
            "status": "ok",
            "version": w.version,
            "sglang_path": w.path,
            "torchvision_stub": stubbed,
            "scenarios": results,
        }
    except Exception as exc:
        out = _error(exc)
        out["traceback"] = traceback.format_exc(limit=8)
    out["import_and_run_s"] = round(time.monotonic() - started, 2)
    sys.stdout.flush()
    print(RESULT_TAG + json.dumps(out, default=str), flush=True)
    sys.stdout.flush()
    os._exit(0)  # real sglang threads (non-daemon in these releases) must not keep the process alive


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
