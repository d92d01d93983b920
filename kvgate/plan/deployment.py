"""A gate profile's `deployment:` section: the worker shape `kvgate plan` sizes, validated on load.

```yaml
deployment:
  model_config: models/glm-5.3/config.json   # relative to the profile file
  gpu_memory_gib: 139.5
  tp: 8
  mem_fraction_static: 0.85
  prefill: {page_size: 64}                   # per-role overrides
  decode: {attention_dp: true, dp: 8}
```
Keys are the `kvgate plan` flags in snake_case; flags win over the profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvgate.errors import ProfileError

ROLES = ("prefill", "decode")
# key -> (type, minimum or None)
FIELDS: dict[str, tuple[type, float | None]] = {
    "model_config": (str, None),
    "gpu_memory_gib": (float, 0.001),
    "gpus_per_worker": (int, 1),
    "tp": (int, 1),
    "dp": (int, 1),
    "attention_dp": (bool, None),
    "pp": (int, 1),
    "mem_fraction_static": (float, 0.001),
    "kv_cache_dtype": (str, None),
    "page_size": (int, 1),
    "weights_gib": (float, 0.0),
    "max_total_tokens": (int, 1),
    "release": (str, None),
    "gpu_sm": (int, 1),
}


def _value(where: str, key: str, value: Any) -> Any:
    kind, minimum = FIELDS[key.rsplit(".", 1)[-1]]
    if kind is bool:
        if not isinstance(value, bool):
            raise ProfileError(where, key, f"expected true or false, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str) or not value:
            raise ProfileError(where, key, f"expected a non-empty string, got {value!r}")
        return value
    ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (minimum is not None and value < minimum):
        what = "an integer" if kind is int else "a number"
        raise ProfileError(where, key, f"expected {what} >= {minimum:g}, got {value!r}")
    return kind(value)


def _section(where: str, prefix: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key not in FIELDS:
            raise ProfileError(
                where,
                f"{prefix}{key}",
                f"unknown key; expected one of {', '.join(sorted(FIELDS))}"
                + (", prefill, decode" if prefix == "deployment." else ""),
            )
        out[key] = _value(where, f"{prefix}{key}", value)
    return out


def parse_deployment(doc: Any, where: str) -> dict[str, dict[str, Any]]:
    """{"prefill": {...}, "decode": {...}}: the common keys merged under each role's overrides."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ProfileError(where, "deployment", f"expected a mapping, got {doc!r}")
    common = {k: v for k, v in doc.items() if k not in ROLES}
    base = _section(where, "deployment.", common)
    out: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        extra = doc.get(role) or {}
        if not isinstance(extra, Mapping):
            raise ProfileError(where, f"deployment.{role}", f"expected a mapping, got {extra!r}")
        merged = dict(base)
        merged.update(_section(where, f"deployment.{role}.", extra))
        if "model_config" in merged:  # relative to the profile file
            path = Path(merged["model_config"])
            merged["model_config"] = str(path if path.is_absolute() else Path(where).parent / path)
        out[role] = merged
    return out
