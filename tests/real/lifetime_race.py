"""Provoking the page-lifetime race on a REAL PD pair (issue 21): a KV write that is still in flight after
its transfer failed, the failed request's decode pages handed to the next request, and whether the late
write lands in them.

The fault is TEST CODE (`_late_write.py`, loaded into the real prefill through KVGATE_TEST_HOOK): one real
`send_kvcache` returns -1 at once and its real Mooncake write is performed later. Everything else is the
release's own code: the prefill's failure handling, the status message, decode's release (at once on
unpatched 0.5.19/0.5.20, whose comment says a prefill-initiated failure "has already stopped writing"; a
hold with #41404 or kvgate-force-arm-on-failure, which outlasts the write only where prefill never ACKs
a failed send as drained: 0.5.22's poisoned sends, kvgate-ack-generations), decode's allocator and the
model's answer.

Three requests through the real router, in ids mode so their lengths are exact (pool P on both sides):
1. A (0.29 P tokens) on the fresh pools: its first KV send is the one that fails; decode reserved its pages
   lowest first, prefill computed its KV lowest first.
2. R (0.37 P tokens, greedy): fits beside A's pages on both sides, so neither pool reuses them. Its answer
   is the reference, and its KV stays in prefill's radix cache.
3. B, the same prompt as R: prefill serves it from that cache (A's KV there is left intact), while
   decode's free list no longer holds B (A + 2 x R > P), so its allocator merges the freed pages back,
   sorted, and hands B the lowest ones: A's, if decode released them.
Decode released A's pages while A's write was in flight if B's own KV send targets any of them (the hook
then lets the late write land right after it, into B's pages; B answers from A's KV). With a hold,
B gets other pages, the write lands in A's held pages when the test signals it (once B was answered),
and B answers R's tokens.

Staged by events: the write lands on B's overlapping send or on the test's signal after B's answer, never
on a clock. What the clock can still do is end decode's hold (its real 30 s timeout) before B arrives on
a very loaded machine: then a reuse of A's pages is the timeout's, not the race's, and the result is
INCONCLUSIVE (not staged), never a verdict. The waits below are outer safety nets naming what they await.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HOOK_FILE = Path(__file__).resolve().parent / "_late_write.py"
VOCAB_LOW, VOCAB_HIGH = 10, 1000  # inside both tiny models' 1,024-token vocabulary, clear of special ids
ANSWER_TOKENS = 16
REQUEST_TIMEOUT_S = 120.0
HOOK_WAIT_S = 120.0  # outer safety net for a hook event that normally follows in milliseconds


def hook_env(folder: Path) -> dict[str, str]:
    """The environment that loads the late-write hook into a pair's workers (only prefill sends KV)."""
    folder.mkdir(parents=True, exist_ok=True)
    return {"KVGATE_TEST_HOOK": str(HOOK_FILE), "KVGATE_TEST_LATE_WRITE_DIR": str(folder)}


@dataclass(frozen=True)
class RaceResult:
    """What one provocation observed, and its verdict in `kvgate backport --verify`'s words.

    NOT RETIRED: the late write landed right after B's own KV send into pages of the failed request A
    (decode had handed them to B while A's write was in flight). RETIRED: B was transferred while the
    write was still pending, into pages its allocator took from the merged free list around A's (so reuse
    was forced), none of them A's, and the write then landed in A's still-held pages. Anything else is
    INCONCLUSIVE, with what was missing.
    """

    outcome: str
    why: str
    failed_room: int | None
    answer_changed: bool
    sizes: dict[str, int]
    a_status: int
    events: list[dict[str, Any]]

    def describe(self) -> str:
        """The whole observation, for an assertion message."""
        out = {k: v for k, v in self.__dict__.items() if k != "events"}
        out["events"] = [{k: v for k, v in e.items() if k != "t"} for e in self.events]
        return json.dumps(out, default=str)


def _events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for(folder: Path, event: str, since: float, within_s: float) -> dict[str, Any] | None:
    end = time.monotonic() + within_s
    while True:  # read at least once, also when within_s is 0
        for e in _events(folder):
            if e["event"] == event and e["t"] >= since:
                return e
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]


def _generate(client: httpx.Client, router: str, ids: list[int]) -> tuple[int, dict[str, Any]]:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": ANSWER_TOKENS, "temperature": 0.0, "ignore_eos": True},
    }
    r = client.post(f"{router}/generate", json=body, timeout=REQUEST_TIMEOUT_S)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {"raw": r.text[:400]}


def _output_ids(status: int, body: dict[str, Any], what: str) -> list[int]:
    ids = body.get("output_ids") if status == 200 else None
    if not isinstance(ids, list) or not ids:
        raise AssertionError(f"{what} was not answered with output_ids: HTTP {status} {str(body)[:400]}")
    return [int(i) for i in ids]


_FAILED_ROOM = re.compile(r"Decode transfer failed for request .*bootstrap_room=(\d+)")


def failed_room(decode_log: Path, after: int) -> int | None:
    """The bootstrap room of the first transfer failure decode logged after byte offset `after`."""
    m = _FAILED_ROOM.search(decode_log.read_bytes()[after:].decode(errors="replace"))
    return int(m.group(1)) if m else None


def wait_for_hold_end(decode_log: Path, room: int, within_s: float) -> str | None:
    """Decode's line that ends its hold of `room` on the deferred-release timeout, once it is logged."""
    needle = f"Deferred KV release for room {room} timed out"
    end = time.monotonic() + within_s
    while True:  # read at least once, also when within_s is 0
        for line in decode_log.read_text(errors="replace").splitlines():
            if needle in line:
                return line.strip()
        if time.monotonic() >= end:
            return None
        time.sleep(0.5)


def _verdict(events: list[dict[str, Any]], hold_timed_out: str | None) -> tuple[str, str]:
    failed = next((e for e in events if e["event"] == "failed_send"), None)
    landed = next((e for e in events if e["event"] == "late_write"), None)
    if failed is None or landed is None:
        return "INCONCLUSIVE", "the failed send or its late write is not in the hook's log"
    if hold_timed_out is not None:
        return "INCONCLUSIVE", (
            "not staged: decode's hold of the failed request ended on its timeout before the write landed "
            f"({hold_timed_out[:200]}); the next request came too late on this machine, rerun the test"
        )
    if landed["trigger"] == "bound":
        return "INCONCLUSIVE", "not staged: the test never signalled the landing; the hook's outer bound landed it"
    a = failed["pages"]
    sends = [e for e in events if e["event"] == "send" and e["t"] <= landed["t"]]
    if landed["trigger"] == "overlap":
        return "NOT RETIRED", (
            f"decode handed {landed['into_later_send']} of the failed request's {a['n']} pages "
            f"({a['lo']}..{a['hi']}) to the next request while their write was in flight; the write landed in "
            "them right after that request's own KV"
        )
    victim = [e for e in sends if e.get("phase") == "B"]
    if not victim:
        return "INCONCLUSIVE", "the next request's KV send is not in the hook's log before the landing"
    if not any(v["pages"]["lo"] < a["lo"] for v in victim):
        return "INCONCLUSIVE", "the next request's pages did not come from a merged free list: reuse was not forced"
    return "RETIRED", (
        f"the next request's pages came from the merged free list around the held {a['n']} pages "
        f"({a['lo']}..{a['hi']}) and none of them; the write landed in the held pages after the next "
        f"request was answered ({landed['t'] - failed['t']:.0f} s after the failure)"
    )


def provoke(router: str, folder: Path, decode_log: Path, pool: int) -> RaceResult:
    """Run A (its send fails, its write lands late), then R and B (module docstring) on fresh pools."""
    sizes = {"pool": pool, "a": int(pool * 0.29), "b": int(pool * 0.37)}
    assert sizes["a"] + sizes["b"] < pool < sizes["a"] + 2 * sizes["b"], sizes
    if _wait_for(folder, "installed", 0.0, HOOK_WAIT_S) is None:
        raise AssertionError(f"the late-write hook is not loaded in the prefill (no 'installed' in {folder})")
    log_at = decode_log.stat().st_size
    start = time.time()
    with httpx.Client() as client:
        (folder / "phase").write_text("A")
        (folder / "arm").write_text("fail the next KV send; land its write late\n")
        a_status, a_body = _generate(client, router, _prompt(1, sizes["a"]))
        if _wait_for(folder, "failed_send", start, HOOK_WAIT_S) is None:
            raise AssertionError(f"A's KV send never reached the hook (HTTP {a_status} {str(a_body)[:300]})")
        if a_status == 200 and a_body.get("output_ids"):
            raise AssertionError(f"A was answered although its KV send failed: {str(a_body)[:300]}")
        if _wait_for(folder, "blacklist_lifted", start, HOOK_WAIT_S) is None:
            raise AssertionError(f"the failed send did not blacklist the decode session: {_events(folder)}")
        b_prompt = _prompt(2, sizes["b"])
        (folder / "phase").write_text("R")
        reference = _output_ids(*_generate(client, router, b_prompt), "the reference request R")
        (folder / "phase").write_text("B")
        victim = _output_ids(*_generate(client, router, b_prompt), "the next request B")
        (folder / "phase").write_text("")
    room = failed_room(decode_log, log_at)
    # Read before the landing: a hold that already ended on the clock means the race was not staged.
    hold_timed_out = wait_for_hold_end(decode_log, room, 0.0) if room is not None else None
    if _wait_for(folder, "late_write", start, 0.0) is None:  # B's send did not land it: the signal does
        (folder / "land").write_text("B was answered\n")
        if _wait_for(folder, "late_write", start, HOOK_WAIT_S) is None:
            raise AssertionError(f"the late write never landed after the test's signal: {_events(folder)}")
    events = [e for e in _events(folder) if e["t"] >= start]
    outcome, why = _verdict(events, hold_timed_out)
    return RaceResult(
        outcome=outcome,
        why=why,
        failed_room=room,
        answer_changed=victim != reference,
        sizes=sizes,
        a_status=a_status,
        events=events,
    )
