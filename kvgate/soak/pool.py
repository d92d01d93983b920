"""The workers' KV pool use over the run, as each worker reports it (`GET /v1/loads`: per DP rank
`num_used_tokens` and `max_total_num_tokens`, or `token_usage`). A worker that does not report it is
named once; its line is simply absent from the plot, never drawn as zero."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from kvgate.output.redact import clip
from kvgate.reading.httpbounds import parse_json

LOADS_PATH = "/v1/loads"


def usage_of(doc: Any) -> float | None:
    """The pool share in use over every rank a /v1/loads document lists (None: it says nothing usable)."""
    loads = doc.get("loads") if isinstance(doc, dict) else None
    if not isinstance(loads, list) or not loads:
        return None
    used = total = 0.0
    shares: list[float] = []
    for rank in loads:
        if not isinstance(rank, dict):
            return None
        u, m, s = (
            _num(rank.get("num_used_tokens")),
            _num(rank.get("max_total_num_tokens")),
            _num(rank.get("token_usage")),
        )
        if u is not None and m is not None and m > 0:
            used, total = used + u, total + m
        elif s is not None:
            shares.append(s)
        else:
            return None
    if total > 0 and not shares:
        return min(1.0, used / total)
    if shares and total == 0:
        return min(1.0, sum(shares) / len(shares))
    return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 else None


class PoolSampler:
    """Reads every worker's pool use every `every_s` seconds in its own thread until stopped."""

    def __init__(self, http: httpx.Client, workers: Sequence[tuple[str, str]], every_s: float, t0: float) -> None:
        self.http = http
        self.workers = list(workers)  # (label, url)
        self.every_s = every_s
        self.t0 = t0
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.problems: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-pool", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def read(self) -> None:
        """One reading of every worker."""
        got: dict[str, float] = {}
        for label, url in self.workers:
            where = url.rstrip("/") + LOADS_PATH
            try:
                resp = self.http.get(where)
                share = usage_of(parse_json(resp.content)) if resp.status_code == 200 else None
                why = None if share is not None else f"HTTP {resp.status_code}: {clip(resp.text, 80)}"
            except (httpx.HTTPError, ValueError) as exc:
                share, why = None, f"{type(exc).__name__}: {clip(str(exc), 80)}"
            if share is None:
                self.problems.setdefault(label, f"{where} gave no pool use ({why})")
            else:
                got[label] = share
        self.samples.append((round(time.monotonic() - self.t0, 3), got))

    def _loop(self) -> None:
        while True:
            self.read()
            if self._stop.wait(self.every_s):
                return
