"""Injected faults of the simulated decode (issue 32): cross-request corruption that only load shows,
and a handoff that decode misreads (issue 39).

These are faults, not releases: any emulated release can carry one, selected by the environment
variable `KVGATE_SIM_INJECT_FAULT` of the decode worker (`kvgate sim up --inject-fault NAME`), or
switched on later through `POST /sim/fault {"fault": NAME}` (a fault that starts after promotion).

- `meta-slot-shared`: the metadata slot allocator hands one slot to two requests (what a double free
  of one index does to `ReqToMetadataIdxAllocator`, sglang #17259/#22716). The room check of #17430
  (in 0.5.19-0.5.23) catches it: the request that reads the other's slot is aborted with "Metadata
  corruption detected - bootstrap_room mismatch" (HTTP 500) and the log says "Context corruption
  detected ... This indicates metadata buffer index collision."
- `meta-slot-shared-unchecked`: the same collision with the room check bypassed (a build without
  #17430, or a path that skips it): the victim silently appends the other request's first token.
- `early-page-reuse`: the decode hands pages to a new request while the prefill still writes into
  them for an earlier one (sglang #24527): the earlier request attends the later one's prompt.
- `handoff-layout` (issue 39): not a load fault. The decode reads every page it received in the wrong
  layout (each page's slots in reverse order: a page-format mismatch between prefill and decode, as a
  heterogeneous-TP head slice or a dtype/layout disagreement would make). Deterministic and alone: the
  first output token (prefill's, sent with the transfer) is right, every later one is computed over
  garbled KV, the same way every time, with nothing foreign in it. Only `probes.handoff` sees it.
- `gradual-drift` (issue 43, the shape of sglang #23020: quality falls after about a hundred long
  requests): the decode answers right for its first `KVGATE_SIM_DRIFT_AFTER` requests (default
  DRIFT_AFTER; counted from when the fault was switched on, `POST /sim/fault {"fault":
  "gradual-drift", "after": N}` sets it at run time), then every token it computes itself (all but the
  first, which prefill sent) drifts to the next byte. Nothing foreign appears; a one-shot gate run
  before the Nth request sees nothing. `GET /sim/state` says when the first drifted answer began
  (`drift_since`, wall-clock seconds) and how many drifted (`stats.drifted`).

"Under load only" (the load faults): a fault strikes a new request only while at least `LOAD_MIN` requests are in the
decode, and only when an earlier request has not committed its transfer yet; a request sent alone is
never hit. SIMULATOR CHOICES (the worst case of the race, so that a test is deterministic): with a
fault on, the decode commits each transfer on a scheduler tick (`TICK_S`; SGLang's decode polls
its transfer queue once per scheduler iteration), so requests that arrive together overlap, and the earlier
request of a colliding pair commits only after the later one's write landed (bounded by `PAIR_WAIT_S`).
"""

from __future__ import annotations

import os

ENV = "KVGATE_SIM_INJECT_FAULT"
META_SLOT_SHARED = "meta-slot-shared"
META_SLOT_SHARED_UNCHECKED = "meta-slot-shared-unchecked"
EARLY_PAGE_REUSE = "early-page-reuse"
HANDOFF_LAYOUT = "handoff-layout"
GRADUAL_DRIFT = "gradual-drift"
#: the decode requests a gradual drift leaves right (`KVGATE_SIM_DRIFT_AFTER` overrides it)
DRIFT_AFTER = 100
DRIFT_ENV = "KVGATE_SIM_DRIFT_AFTER"
#: the faults that strike only under load (the rest strike every request)
LOAD_FAULTS = (META_SLOT_SHARED, META_SLOT_SHARED_UNCHECKED, EARLY_PAGE_REUSE)
FAULTS = (*LOAD_FAULTS, HANDOFF_LAYOUT, GRADUAL_DRIFT)
#: requests in the decode (the new one not counted) before a fault strikes
LOAD_MIN = 3
#: the faulty decode's scheduler tick (seconds between a transfer's end and its commit)
TICK_S = 0.1
#: the longest the earlier request of a colliding pair waits for the later one's write
PAIR_WAIT_S = 5.0

#: What real SGLang 0.5.19-0.5.23 says (`disaggregation/decode.py _commit_transfer_to_req`).
ABORT_MESSAGE = "Metadata corruption detected - bootstrap_room mismatch"


def log_message(rid: str, expected: int, actual: int, idx: int) -> str:
    """The decode's error log line on a room mismatch (same shape as SGLang's)."""
    return (
        f"Context corruption detected: Request {rid} (bootstrap_room={expected}) received metadata from "
        f"bootstrap_room={actual}. Metadata buffer index: {idx}. This indicates metadata buffer index collision."
    )


def from_env() -> str | None:
    """The fault named by `KVGATE_SIM_INJECT_FAULT`; ValueError for an unknown name."""
    raw = os.environ.get(ENV, "").strip()
    return check(raw) if raw else None


def check(name: str | None) -> str | None:
    """`name` when it is a known fault (or None/""); ValueError otherwise."""
    if not name:
        return None
    if name not in FAULTS:
        raise ValueError(f"unknown injected fault {name!r}; choose one of {', '.join(FAULTS)}")
    return name


def drift_after_from_env() -> int:
    """`KVGATE_SIM_DRIFT_AFTER` (requests answered right before the drift), or DRIFT_AFTER."""
    raw = os.environ.get(DRIFT_ENV, "").strip()
    if not raw:
        return DRIFT_AFTER
    if not raw.isdigit():
        raise ValueError(f"{DRIFT_ENV}={raw!r}: expected a whole number of requests")
    return int(raw)


def drifted(token: int, vocab: int) -> int:
    """The drifted token: the next id, never the pad id 0."""
    return token % (vocab - 1) + 1
