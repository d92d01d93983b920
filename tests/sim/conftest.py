"""Helpers for the simulator tests: deployments, prompts with sentinels, polling."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.assets.sim_setup import sizes

FILLER = "the quick brown fox jumps over the lazy dog\n"

# incident.md section 2 at small scale: prefill pool < an over-pool prompt < context, decode pool large.
CONTEXT, PREFILL_POOL, DECODE_POOL, PAGE = 4096, 1024, 16384, 16
SMALL_INCIDENT = sizes(CONTEXT, PREFILL_POOL, DECODE_POOL, PAGE)


def sentinel_prompt(sentinel: str, tokens: int) -> str:
    """A byte-level prompt of exactly `tokens` tokens: repeated filler lines around one sentinel line."""
    head = FILLER * 3 + sentinel + "\n"
    body = head + FILLER * (tokens // len(FILLER) + 1)
    return body[:tokens]


def state(url: str) -> dict[str, Any]:
    """A worker's simulator-only introspection (`GET /sim/state`)."""
    return httpx.get(url + "/sim/state", timeout=10).json()


def wait_for(pred: Callable[[], bool], deadline_s: float = 30.0, poll_s: float = 0.05) -> bool:
    """Poll `pred` until true or the deadline passes; returns the last value."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(poll_s)
    return pred()


def generate(url: str, body: dict[str, Any], timeout: float = 120.0) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=timeout)
