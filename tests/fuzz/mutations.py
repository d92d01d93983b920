"""Ways a JSON document a gate reads can be broken, applied at one path (drop, null, retype, ...)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

Path = tuple[Any, ...]

# Each makes the value at the path unusable for a gate that needs it.
BREAKING = (
    "drop",
    "null",
    "retype_str",
    "retype_list",
    "retype_obj",
    "retype_bool",
    "retype_frac",
    "negative",
    "zero",
    "nested_wrong",
)
# Not broken by itself (a bigger number can be a real value): only "no crash, a documented exit" holds.
OTHER = ("huge",)
KINDS = BREAKING + OTHER

# The paths gate 1 rests on (sglang-surface.md section 1; kvgate/gates/pool_context.py), per document.
NEEDED_INFO: set[Path] = {
    ("max_total_num_tokens",),
    ("max_req_input_len",),
    ("internal_states",),
    ("internal_states", 0),
    ("internal_states", 0, "memory_usage"),
    ("internal_states", 0, "memory_usage", "token_capacity"),
    ("dp_size",),
}
NEEDED_MODELS: set[Path] = {("data",), ("data", 0), ("data", 0, "max_model_len")}


def paths(doc: Any, prefix: Path = (), depth: int = 4) -> Iterator[Path]:
    """Every path into `doc` (object keys and the first list element), down to `depth`."""
    if depth == 0:
        return
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from paths(v, prefix + (k,), depth - 1)
    elif isinstance(doc, list) and doc:
        yield prefix + (0,)
        yield from paths(doc[0], prefix + (0,), depth - 1)


def _new_value(kind: str, v: Any) -> Any:
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == "null":
        return None
    if kind == "retype_str":
        return str(v) if not isinstance(v, str) else 12345
    if kind == "retype_list":
        return [v]
    if kind == "retype_obj":
        return {"value": v}
    if kind == "retype_bool":
        return True
    if kind == "retype_frac":
        return v + 0.5 if number else 0.5
    if kind == "negative":
        return -abs(v) - 1 if number else -1
    if kind == "zero":
        return 0
    if kind == "nested_wrong":
        return {"unexpected": {"nesting": [v]}}
    if kind == "huge":
        return 10**30 if number else "x" * 100_000
    raise ValueError(kind)


def mutate(doc: Any, path: Path, kind: str) -> Any:
    """A deep copy of `doc` with the value at `path` broken the `kind` way."""
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "drop":
        del parent[last]
    else:
        parent[last] = _new_value(kind, parent[last])
    return out


def with_duplicate_key(doc: dict[str, Any], key: str, value: Any) -> bytes:
    """`doc` as JSON text whose top-level `key` appears twice with different values."""
    body = json.dumps(doc)
    return ("{" + json.dumps(key) + ": " + json.dumps(value) + ", " + body[1:]).encode()


def label(path: Path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
