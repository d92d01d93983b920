"""`defenses.deferred-release` (per node): deferred decode KV release must be on, on a backend that supports it.

SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE must be on and the transfer backend must support it
(mooncake, nixl, ascend; mori from 0.5.22). The variable has no CLI flag and is not in server_info:
it is read from the exposed env vars (SGLANG_EXPOSE_OWN_ENV_VARS=1), else from the operator / profile;
when neither says, it is unknown -> inconclusive. Exposed but unset, the default applies: the one of the
code the node runs when that code was read (whether it carries #41023's default, e.g. by kvgate's
backport: a backported 0.5.20 runs with it on), else the one of its release.
"""

from __future__ import annotations

from packaging.version import Version

from kvgate.catalogue import Presence
from kvgate.gates.defenses.common import GATE, DefenseInputs, backend_of, env_bool, release_of
from kvgate.results.findings import Evidence, Finding, failed, inconclusive, passed
from kvgate.upstream.releases import DEFERRED_DEFAULT_FIX, DEFERRED_ENV, DEFERRED_RELEASE_DEFAULT

# The first release whose default is on (for remedies).
_DEFERRED_ON_FROM = min((r for r, on in DEFERRED_RELEASE_DEFAULT.items() if on), key=Version)
# Backends whose manager sends ABORT_ACK / declares supports_deferred_decode_kv_release
# (mooncake, nixl; ascend inherits mooncake; mori from 0.5.22).
_DEFERRED_BACKENDS = ("mooncake", "nixl", "ascend")
_MORI_FROM = Version("0.5.22")


def _default(n: DefenseInputs) -> tuple[bool | None, str]:
    """The variable's default for this node, and where it was read: the code it runs (read, and #41023's
    default found present or absent there by the code itself), else its release's."""
    if n.fixes is not None:
        try:
            s = n.fixes.status(DEFERRED_DEFAULT_FIX)
        except KeyError:
            s = None
        if s is not None and s.presence in (Presence.PRESENT, Presence.ABSENT) and not (s.version_only or s.weak):
            how = f"by kvgate backport {s.via_backport}" if s.via_backport else f"by {s.decided_by}"
            return s.presence is Presence.PRESENT, f"default of the code read: #41023 {s.presence.value} {how}"
    rel = release_of(n)
    default = DEFERRED_RELEASE_DEFAULT.get(str(rel.version)) if rel is not None and rel.is_final else None
    return default, f"default of {rel.version if rel else '?'}"


def check_deferred(n: DefenseInputs, operator_env: bool | None) -> Finding:
    rel = release_of(n)
    backend = backend_of(n)
    ev = [Evidence(n.node, "transfer_backend", n.transfer_backend, "mooncake|nixl|ascend (mori from 0.5.22)")]
    default, default_of = _default(n)
    on: bool | None
    if n.env_vars is not None and DEFERRED_ENV in n.env_vars:
        on = env_bool(n.env_vars[DEFERRED_ENV])
        ev.append(Evidence(n.node, f"env {DEFERRED_ENV}", n.env_vars[DEFERRED_ENV], "true|1|yes|y"))
        if on is None:
            return inconclusive(
                GATE,
                "deferred-release",
                n.node,
                f"{DEFERRED_ENV}={n.env_vars[DEFERRED_ENV]!r} is not a boolean sglang reads",
                *ev,
            )
    elif operator_env is not None:
        on = operator_env
        ev.append(Evidence(n.node, f"{DEFERRED_ENV} (operator/profile)", operator_env, "true"))
    elif n.env_vars is not None and default is not None:
        on = default
        ev.append(Evidence(n.node, f"{DEFERRED_ENV} (unset; {default_of})", default, "true"))
    else:
        ev.append(
            Evidence(
                n.node,
                f"{DEFERRED_ENV}",
                "not readable",
                f"exposed env (SGLANG_EXPOSE_OWN_ENV_VARS=1) or operator input; release default {default}",
            )
        )
        return inconclusive(
            GATE,
            "deferred-release",
            n.node,
            "deferred decode KV release: the effective env is unknown (no CLI flag, not in server_info)",
            *ev,
            remedy="start workers with SGLANG_EXPOSE_OWN_ENV_VARS=1, or state the value with "
            "--deferred-release / --no-deferred-release "
            "(profile: defenses.deferred_release_env)",
        )
    if on is False:
        return failed(
            GATE,
            "deferred-release",
            n.node,
            "deferred decode KV release is OFF: pages can be freed while an aborted transfer may still write them",
            *ev,
            remedy=f"set {DEFERRED_ENV}=1 on every prefill and decode worker (default on from {_DEFERRED_ON_FROM})",
        )
    if backend is None:
        return inconclusive(
            GATE,
            "deferred-release",
            n.node,
            "deferred release on, but the transfer backend is unknown: cannot tell whether it supports it",
            *ev,
        )
    supported = backend in _DEFERRED_BACKENDS or (backend == "mori" and rel is not None and rel.base >= _MORI_FROM)
    if backend == "mori" and rel is None:
        return inconclusive(
            GATE,
            "deferred-release",
            n.node,
            "deferred release on with mori, which supports it only from 0.5.22; version unknown",
            *ev,
        )
    if not supported:
        return failed(
            GATE,
            "deferred-release",
            n.node,
            f"deferred release is on but backend {backend} "
            f"{'in ' + n.version if n.version else ''} does not support it: no drain ACK protects the pages",
            *ev,
            remedy="use mooncake, nixl or ascend (mori from sglang 0.5.22)",
        )
    return passed(
        GATE, "deferred-release", n.node, f"deferred decode KV release on, backend {backend} supports it", *ev
    )
