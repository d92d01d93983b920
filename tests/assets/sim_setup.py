"""Setup shared by the tests that start a simulated deployment: its sizing, and the flags that name its
workers to `kvgate check`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class _Workers(Protocol):
    prefill_urls: list[str]
    decode_urls: list[str]


class _RoutedWorkers(_Workers, Protocol):
    router_url: str | None


def sizes(context: int, prefill_pool: Any, decode_pool: Any, page: int | None = None) -> dict[str, Any]:
    """The numbers a simulated deployment is sized by, as `deployment(...)` keywords: the context length,
    the prefill and decode pools (one value or one per worker), and the page size where one is given."""
    kw: dict[str, Any] = {"context_length": context, "prefill_pool": prefill_pool, "decode_pool": decode_pool}
    if page is not None:
        kw["page_size"] = page
    return kw


def worker_flags(dep: _Workers) -> list[str]:
    """`--prefill-url U` for each prefill worker, then `--decode-url U` for each decode worker, in order."""
    return [a for u in dep.prefill_urls for a in ("--prefill-url", u)] + [
        a for u in dep.decode_urls for a in ("--decode-url", u)
    ]


# `kvgate sim up`'s own defaults (kvgate/sim/cli.py), and a healthy prefill pool for them (1.25 x the context).
SIM_UP = {"context_length": 8192, "decode_pool": 65536, "page_size": 16, "chunked_prefill_size": 8192}
HEALTHY_POOL = 10240


def check_args(dep: _RoutedWorkers, out: Path) -> list[str]:
    """`kvgate check` of `dep` through its router and each worker named, trusted version, JSON into `out`."""
    args = ["check", "--quiet", "--router-url", str(dep.router_url), "--trust-version", "-f", "json", "-o", str(out)]
    return args + worker_flags(dep)


def doubt_opted_out_args(router_url: str, dep: _Workers, out: Path) -> list[str]:
    """`kvgate check` through `router_url` with each worker of `dep` named, 8 tenants, JSON into `out`, doubt
    opted out of (`--trust-version --deferred-release --no-strict`): a failure still exits 1."""
    args = ["check", "--router-url", router_url, "-q", "--tenants", "8", "-f", "json", "-o", str(out)]
    return args + worker_flags(dep) + ["--trust-version", "--deferred-release", "--no-strict"]
