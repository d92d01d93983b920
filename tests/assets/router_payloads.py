"""Router worker lists shaped like the real ones.

`smg_entry` has the keys smg 1.13.0 really returns for a worker on `GET /workers` (observed behind the
simulator in tests/commands/test_fleet_cli.py; a real entry also carries `models`, `labels`,
`priority`, `cost`, ...). `list_workers` is the older sgl-router's `GET /list_workers` (fleet.md 2).
"""

from __future__ import annotations

from typing import Any


def smg_entry(
    url: str,
    worker_type: str,
    *,
    status: str = "ready",
    healthy: bool = True,
    bootstrap_port: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": f"id-{url}",
        "model_id": "glm-5.3",
        "url": url,
        "worker_type": worker_type,
        "connection_mode": "http",
        "runtime_type": "sglang",
        "labels": {"disaggregation_mode": worker_type},
        "priority": 50,
        "cost": 1.0,
        "max_connection_attempts": 20,
        "is_healthy": healthy,
        "status": status,
        "load": 0,
        "http2": False,
        "pd_pairing": "sglang/?/?",
    }
    if bootstrap_port is not None:
        entry["bootstrap_port"] = bootstrap_port
    entry.update(extra)
    return entry


def smg_workers(*entries: dict[str, Any]) -> dict[str, Any]:
    roles = [e["worker_type"] for e in entries]
    return {
        "workers": list(entries),
        "total": len(entries),
        "stats": {
            "prefill_count": roles.count("prefill"),
            "decode_count": roles.count("decode"),
            "regular_count": roles.count("regular"),
        },
    }


def list_workers(*urls: str) -> dict[str, Any]:
    return {"urls": list(urls)}
