"""Sending one request to a chosen prefill/decode pair the way the router does.

smg forwards a PD request by POSTing the same JSON to the prefill and the decode at the same time,
after adding `bootstrap_host` (the prefill URL's host), `bootstrap_port` (the CLI value given with
`--prefill URL PORT`) and a random `bootstrap_room` (sglang-surface.md section 3). This helper does
exactly that for tests and drills that need to pin a request to one prefill (the router's policy
decides otherwise). It is a client, not a router: no retries, no policy, no response mapping.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import httpx


@dataclass
class PDResponse:
    """Both halves of one PD request."""

    prefill: httpx.Response
    decode: httpx.Response


def pd_generate(
    prefill_url: str,
    bootstrap_port: int,
    decode_url: str,
    body: dict[str, Any],
    *,
    path: str = "/generate",
    timeout: float = 600.0,
    room: int | None = None,
) -> PDResponse:
    """POST `body` (plus bootstrap_host/port/room) to prefill and decode concurrently; wait for both."""
    payload = dict(body)
    payload["bootstrap_host"] = urlparse(prefill_url).hostname
    payload["bootstrap_port"] = bootstrap_port
    payload["bootstrap_room"] = room if room is not None else random.getrandbits(63)
    results: dict[str, httpx.Response | BaseException] = {}

    def post(name: str, url: str) -> None:
        try:
            results[name] = httpx.post(url + path, json=payload, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller below
            results[name] = exc

    threads = [
        threading.Thread(target=post, args=("prefill", prefill_url)),
        threading.Thread(target=post, args=("decode", decode_url)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for value in results.values():
        if isinstance(value, BaseException):
            raise value
    return PDResponse(prefill=results["prefill"], decode=results["decode"])  # type: ignore[arg-type]
