"""The profile's `defenses:` section: operator knowledge the servers do not expose, and what to require."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvgate.errors import ProfileError

#: Keys of a gate profile's `defenses:` section, with the type each must have.
DEFENSE_KEYS: dict[str, type] = {
    "deferred_release_env": bool,
    "model_arch": str,
    "require_checksum": bool,
    "require_canary": bool,
    "trust_version": bool,
}


def defense_options(section: Mapping[str, object], where: str = "profile") -> dict[str, object]:
    """Validate a profile's `defenses:` mapping (ProfileError naming the key if bad)."""
    out: dict[str, object] = {}
    for key, value in section.items():
        if key not in DEFENSE_KEYS:
            raise ProfileError(where, f"defenses.{key}", f"unknown key; expected one of {sorted(DEFENSE_KEYS)}")
        if value is not None and not isinstance(value, DEFENSE_KEYS[key]):
            raise ProfileError(where, f"defenses.{key}", f"expected {DEFENSE_KEYS[key].__name__}, got {value!r}")
        out[key] = value
    return out


@dataclass(frozen=True)
class DefenseOptions:
    """The validated section. `deferred_release_env`: the operator's value of the deferred-release variable
    for nodes that do not expose their env; `model_arch`: the architecture when nodes do not report it;
    `require_*`: fail instead of reporting when that detection aid does not count; `trust_version`: let a
    version string alone decide the correctness fixes (reported as such)."""

    deferred_release_env: bool | None = None
    model_arch: str | None = None
    require_checksum: bool = False
    require_canary: bool = False
    trust_version: bool = False

    @classmethod
    def from_section(cls, section: Mapping[str, object], where: str = "profile") -> DefenseOptions:
        raw = defense_options(section, where)
        env, arch = raw.get("deferred_release_env"), raw.get("model_arch")
        return cls(
            deferred_release_env=env if isinstance(env, bool) else None,
            model_arch=arch if isinstance(arch, str) else None,
            require_checksum=raw.get("require_checksum") is True,
            require_canary=raw.get("require_canary") is True,
            trust_version=raw.get("trust_version") is True,
        )
