"""Gate profiles: YAML files that pin what a deployment must satisfy. Validated on load.

Every error names the file, the key and what was expected (exit 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvgate.errors import ProfileError
from kvgate.paths import profiles_dir
from kvgate.plan.deployment import parse_deployment
from kvgate.results.waivers import Waiver, parse_waivers

SCHEMA = 1


@dataclass(frozen=True)
class Profile:
    """A validated gate profile. None means "not set here" (flags or defaults decide)."""

    name: str
    path: str
    description: str = ""
    context_length: int | None = None
    headroom: float | None = None
    timeout: float | None = None
    strict: bool | None = None
    probes: Mapping[str, Any] = field(default_factory=dict)
    defenses: Mapping[str, Any] = field(default_factory=dict)
    waivers: tuple[Waiver, ...] = ()
    code: Mapping[str, Any] = field(default_factory=dict)
    # `kvgate plan`'s worker shape per role (kvgate.plan.deployment), merged and validated.
    deployment: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # `kvgate watch`: interval, probe traffic budget, verdict age (validated by kvgate.watch.settings).
    watch: Mapping[str, Any] = field(default_factory=dict)
    # `kvgate soak`: load shape, slices and SLOs (validated by kvgate.soak.settings).
    soak: Mapping[str, Any] = field(default_factory=dict)


_TOP_KEYS = {
    "schema",
    "name",
    "description",
    "context_length",
    "headroom",
    "timeout",
    "strict",
    "probes",
    "defenses",
    "waivers",
    "code",
    "deployment",
    "watch",
    "soak",
}


def resolve(ref: str) -> Path:
    """A profile reference is a path, or the name of a bundled profile (e.g. `glm-5.3-1m`)."""
    path = Path(ref)
    if path.is_file():
        return path
    bundled = profiles_dir() / (ref if ref.endswith((".yaml", ".yml")) else ref + ".yaml")
    if bundled.is_file():
        return bundled
    known = ", ".join(sorted(p.stem for p in profiles_dir().glob("*.yaml")))
    raise ProfileError(ref, None, f"no such file, and no bundled profile of that name (bundled: {known})")


def _int(path: str, key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(path, key, f"expected an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ProfileError(path, key, f"expected an integer >= {minimum}, got {value}")
    return value


def _float(path: str, key: str, value: Any, minimum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(path, key, f"expected a number >= {minimum:g}, got {value!r}")
    if value < minimum:
        raise ProfileError(path, key, f"expected a number >= {minimum:g}, got {value}")
    return float(value)


#: the largest profile file read
MAX_PROFILE_BYTES = 1 << 20


def _refuse_aliases(where: str, text: str) -> None:
    """YAML anchors and aliases are refused: an alias can expand a few hundred bytes into gigabytes
    (a "billion laughs"), and a profile needs neither."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            line = event.start_mark.line + 1 if event.start_mark else "?"
            raise ProfileError(where, None, f"line {line}: YAML anchors and aliases (&name, *name) are not allowed")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error as one line naming the line and column (its own text spans lines and names the
    stream "<unicode string>", not the file, which the caller names)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    parts = [str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p]
    what = ", ".join(parts) or " ".join(str(exc).split())
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def load(ref: str) -> Profile:
    """Load and validate one profile."""
    path = resolve(ref)
    where = str(path)
    try:
        if path.stat().st_size > MAX_PROFILE_BYTES:
            raise ProfileError(where, None, f"larger than {MAX_PROFILE_BYTES:,} bytes: a profile is a page of YAML")
        text = path.read_text(encoding="utf-8")
        _refuse_aliases(where, text)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(where, None, f"not valid YAML: {_yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(where, None, f"cannot read: {exc}") from None
    if not isinstance(doc, dict):
        raise ProfileError(where, None, f"expected a mapping at the top level, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ProfileError(where, unknown[0], f"unknown key; expected one of {', '.join(sorted(_TOP_KEYS))}")
    if "schema" in doc and doc["schema"] != SCHEMA:
        raise ProfileError(where, "schema", f"expected {SCHEMA}, got {doc['schema']!r}")
    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ProfileError(where, "name", f"expected a non-empty string, got {name!r}")
    desc = doc.get("description", "")
    if not isinstance(desc, str):
        raise ProfileError(where, "description", f"expected a string, got {desc!r}")
    strict = doc.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ProfileError(where, "strict", f"expected true or false, got {strict!r}")
    for section in ("probes", "defenses", "code", "watch", "soak"):
        if section in doc and not isinstance(doc[section], dict):
            raise ProfileError(where, section, f"expected a mapping, got {doc[section]!r}")
    return Profile(
        name=name,
        path=where,
        description=desc,
        context_length=(
            None if doc.get("context_length") is None else _int(where, "context_length", doc["context_length"], 1)
        ),
        headroom=None if doc.get("headroom") is None else _float(where, "headroom", doc["headroom"], 1.0),
        timeout=None if doc.get("timeout") is None else _float(where, "timeout", doc["timeout"], 0.1),
        strict=strict,
        probes=dict(doc.get("probes") or {}),
        defenses=dict(doc.get("defenses") or {}),
        waivers=parse_waivers(doc.get("waivers"), where),
        code=dict(doc.get("code") or {}),
        deployment=parse_deployment(doc.get("deployment"), where),
        watch=dict(doc.get("watch") or {}),
        soak=dict(doc.get("soak") or {}),
    )
