"""`kvgate soak` against a simulated deployment with a long context, whose prefill time grows with the
prompt: at the default service levels a healthy one passes `soak.slo` although its near-limit prompts
take far longer than the flat 20 s time-to-first-token level (each bucket is judged against the level
plus its prefill allowance), and a real slowdown of the same deployment still fails it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvgate.soak.settings import Slo
from tests.soak.helpers import soak

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

#: 128k context, 20k tokens/s of prefill: the near-limit prompt takes about 6.5 s alone and several
#: times that while it shares the prefill with the load's other requests
LONG: dict[str, Any] = {
    "emulate": "0.5.23",
    "context_length": 131072,
    "prefill_pool": 262144,
    "decode_pool": 262144,
    "page_size": 16,
    "prefill_tokens_per_s": 20000.0,
}


def _slo(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["findings"] if f["check"] == "slo"]


def test_a_healthy_long_context_passes_the_soak_slo_at_the_defaults(
    deployment: Callable[..., Any], tmp_path: Path
) -> None:
    dep = deployment(**LONG)
    # 12 s of load: the default mix's seeded draw sends its first near-limit prompt as its 32nd request
    code, doc, page, out = soak(dep.router_url, tmp_path, "--duration", "12", "--slice", "3")
    soak_data = doc["cost"]["soak"]
    assert code == 0, out
    assert all(f["outcome"] == "passed" for f in _slo(doc))
    prefill = soak_data["prefill"]
    assert prefill["tokens_per_s"] and prefill["source"].startswith("measured alone before the load")
    run = soak_data["run"]
    # the false block this fixes: healthy long prompts took longer than the flat level, and met their own
    flat = Slo().ttft_p99_s
    assert flat is not None and run["stats"]["ttft_p99_s"] > flat, run["stats"]
    over = [lv for lv in run["levels"] if lv["name"] == "ttft_p99_s" and lv.get("bucket") and lv["measured"] > flat]
    assert over and all(lv["met"] and lv["stated"] > lv["measured"] for lv in over), run["levels"]
    assert {lv["bucket"] for lv in over} <= {"long", "near_limit"}
    assert "prefill allowance" in page.read_text() or "tokens/s of prefill" in page.read_text()


def test_the_same_long_context_slowed_down_still_fails_the_soak_slo(
    deployment: Callable[..., Any], tmp_path: Path
) -> None:
    """The simulator's slow end-to-end fault (every answer takes 10x its time to the KV): the prefill rate
    measured alone is the healthy one (a one-token answer), and the answers miss their buckets' levels."""
    dep = deployment(**LONG, e2e_factor=10.0)
    code, doc, _page, out = soak(dep.router_url, tmp_path)
    assert code == 1, out
    prefill = doc["cost"]["soak"]["prefill"]
    assert prefill["tokens_per_s"] and prefill["source"].startswith("measured alone before the load")
    run = next(f for f in _slo(doc) if f["node"] == "run")
    assert run["outcome"] == "failed", run["summary"]
    assert "prefill allowance" in run["summary"] or "error_rate" in run["summary"], run["summary"]
    assert "tokens/s of prefill (measured alone before the load" in run["summary"]
