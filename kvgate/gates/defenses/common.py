"""What every check of the defenses gate reads: one worker's inputs, and the rules they share.

Each check module (`release`, `deferred`, `checksum`, `canary`) imports this one and nothing of the
others; `code` reads the code each node runs, `gate` runs them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvgate.catalogue import Assessment, parse_release
from kvgate.catalogue.version import ReleaseString
from kvgate.errors import UsageError
from kvgate.reading.node import NodeReading
from kvgate.results.findings import Evidence, Finding, failed, inconclusive

GATE = "defenses"

_TRUE = {"true", "1", "yes", "y"}
_FALSE = {"false", "0", "no", "n"}


@dataclass(frozen=True)
class DefenseInputs:
    """What the defenses gate needs from one worker. None always means "not known"."""

    node: str
    role: str
    version: str | None
    transfer_backend: str | None
    kv_checksum: bool | None
    kv_canary: str | None
    tp_size: int | None
    env_vars: Mapping[str, str] | None
    architectures: tuple[str, ...] | None
    device: str | None = None
    page_size: int | None = None
    pp_size: int | None = None
    # Assessment of the code this node runs (trusted over `version`), from kvgate.catalogue.assess_code
    # on a scan that vouches for this node (kvgate.gates.defenses.code); None = only the version string.
    fixes: Assessment | None = None
    # Why reading the code failed (the --python command hung, failed or answered garbage): an error.
    code_error: str | None = None
    # Why a scan that was read is not evidence for this node (its declared version is not the one the
    # node reports, or one scan stood for several nodes and cannot be matched to this one).
    code_doubt: str | None = None
    # How many nodes the scan behind `fixes` was read for (more than one: it vouches for this node
    # because the versions agree; see kvgate.gates.defenses.code).
    code_shared_by: int = 1
    # The assessment of a scan read for this node alone (a per-node template, a URL or role entry)
    # that declares another version than the node reports: the operator named it this node's code,
    # so what it lacks is said plainly (kvgate.gates.defenses.release), yet it is not counted as proof.
    code_scan: Assessment | None = None


def inputs_from_reading(reading: NodeReading) -> DefenseInputs:
    """The defenses gate's view of one worker as kvgate.reading.target read it."""
    info = reading.server_info
    device = info.get("device")
    pp_size = info.get("pp_size")
    return DefenseInputs(
        node=reading.node,
        role=reading.role,
        version=reading.version,
        transfer_backend=reading.transfer_backend,
        kv_checksum=reading.kv_checksum,
        kv_canary=reading.kv_canary,
        tp_size=reading.tp_size,
        env_vars=dict(reading.env_vars) if reading.env_vars is not None else None,
        architectures=tuple(reading.architectures) if reading.architectures is not None else None,
        device=device if isinstance(device, str) else None,
        page_size=reading.page_size,
        pp_size=pp_size if isinstance(pp_size, int) and not isinstance(pp_size, bool) else None,
    )


def release_of(n: DefenseInputs) -> ReleaseString | None:
    """The node's reported version, parsed (None when absent or not PEP 440)."""
    if not n.version:
        return None
    try:
        return parse_release(n.version)
    except UsageError:
        return None


def backend_of(n: DefenseInputs) -> str | None:
    """The transfer backend, lowercased; mooncake_tcp is mooncake."""
    if not n.transfer_backend:
        return None
    b = n.transfer_backend.strip().lower()
    return "mooncake" if b == "mooncake_tcp" else b


def env_bool(value: str) -> bool | None:
    """A boolean env value as sglang reads it; None when it is not one."""
    v = value.strip().lower()
    return True if v in _TRUE else False if v in _FALSE else None


def not_counted(check: str, node: str, summary: str, required: bool, *ev: Evidence, remedy: str) -> Finding:
    """An opt-in detection aid that is on but does not count: failed when required, else inconclusive."""
    if required:
        return failed(GATE, check, node, summary, *ev, remedy=remedy)
    return inconclusive(GATE, check, node, summary, *ev, remedy=remedy)
