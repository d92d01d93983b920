"""Fleet baselines (checklist item 5: re-run the gate on every capacity change).

`--write-baseline FILE` records, per worker, what its capacity and safety rest on; `--baseline FILE`
compares a later run with it: any change, and any worker added or removed, fails until the baseline
is renewed. The file is plain JSON (sorted keys, one field per line) so a review diff shows the change.

    {"schema_version": 1, "kind": "kvgate-baseline", "written_at": "...", "router": URL | null,
     "workers": {"http://10.0.0.7:30000": {"role": "prefill", "release": "0.5.22", "pool": 2040000, ...}}}

Workers are keyed by their normalized URL, the only identity a router gives: a rollout that moves
workers to new addresses shows as removed + added, and the baseline is renewed with it.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgate.errors import UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.output import sinks
from kvgate.output.redact import redact_obj
from kvgate.reading.discovery import normalize_url
from kvgate.reading.node import NodeReading
from kvgate.results.findings import Evidence, Finding, Outcome, exit_status_for, failed, inconclusive, passed
from kvgate.upstream.releases import DEFERRED_ENV

SCHEMA_VERSION = 1
KIND = "kvgate-baseline"
GATE = "baseline"
RENEW = "if the change is intended, gate it and renew the baseline: kvgate check ... --write-baseline FILE"


def worker_record(reading: NodeReading, findings: Sequence[Finding]) -> dict[str, Any]:
    """What one worker's capacity and safety rest on, as the run observed it."""
    code = None
    for f in findings:
        if f.gate == "defenses" and f.check == "release" and f.node == reading.node:
            code = {
                "verdict": f.outcome.value,
                **{e.field: e.value for e in f.evidence if e.field == "code" or e.expected == "present"},
            }
    env = reading.env_vars
    return {
        "role": reading.role,
        "release": reading.version,
        "code": code,
        "pool": reading.max_total_num_tokens,
        "dp_pools": [rank.token_capacity for rank in reading.ranks],
        "context": reading.context_length if reading.context_length is not None else reading.context_length_flag,
        "max_req_input_len": reading.max_req_input_len,
        "page_size": reading.page_size,
        "tp_size": reading.tp_size,
        "dp_size": reading.dp_size,
        "transfer_backend": reading.transfer_backend,
        "defenses": {
            "kv_checksum": reading.kv_checksum,
            "kv_canary": reading.kv_canary,
            "deferred_release_env": None if env is None else env.get(DEFERRED_ENV),
        },
    }


def record(readings: Sequence[NodeReading], findings: Sequence[Finding], router: str | None) -> dict[str, Any]:
    """The baseline document of a run."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "router": router,
        "workers": {normalize_url(r.spec.url): worker_record(r, findings) for r in readings},
    }


def save(doc: Mapping[str, Any], path: Path) -> None:
    """Write atomically (`safeio.write_atomic`: no planted temp name or symlink is followed): sorted keys,
    indented, newline-terminated (diffable). It is an output like any report: what a worker echoed of a
    secret is redacted (the document, then its bytes, at `sinks.write_file`)."""
    sinks.write_file(path, json.dumps(redact_obj(dict(doc)), indent=2, sort_keys=True) + "\n")


def load(path: Path) -> dict[str, Any]:
    """Read and validate a baseline file; any problem is a usage error naming the file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"baseline {path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"baseline {path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise UsageError(f'baseline {path}: not a kvgate baseline (expected "kind": "{KIND}")')
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise UsageError(
            f"baseline {path}: schema_version {doc.get('schema_version')!r} is not {SCHEMA_VERSION}; "
            "renew it with --write-baseline"
        )
    workers = doc.get("workers")
    if not isinstance(workers, dict) or not all(isinstance(v, dict) for v in workers.values()):
        raise UsageError(f"baseline {path}: 'workers' must map worker URLs to objects")
    return doc


def compare(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    labels: Mapping[str, str],
    unread: Sequence[str],
    source: str,
) -> list[Finding]:
    """Findings for every field that changed, every worker added or removed, per worker.

    `labels` maps normalized URLs to node labels; `unread` lists the URLs that could not be read
    this time (their drift is unknown, not "removed").
    """
    old: Mapping[str, Any] = baseline["workers"]
    new: Mapping[str, Any] = current["workers"]
    unread_set = set(unread)
    out: list[Finding] = []
    for url in sorted(set(old) | set(new), key=lambda u: labels.get(u, u)):
        node = labels.get(url, f"worker {url}")
        if url not in new:
            if url in unread_set:
                out.append(inconclusive(GATE, "drift", node, f"not read this time: drift against {source} unknown"))
            else:
                out.append(
                    failed(
                        GATE,
                        "removed",
                        node,
                        f"in the baseline {source} but no longer in the fleet",
                        Evidence(node, "worker", None, f"present (baseline {source})"),
                        remedy=RENEW,
                    )
                )
            continue
        if url not in old:
            out.append(
                failed(
                    GATE,
                    "added",
                    node,
                    f"not in the baseline {source}: a new worker, never baselined",
                    Evidence(node, "worker", url, f"absent (baseline {source})"),
                    remedy=RENEW,
                )
            )
            continue
        changes = [
            (k, old[url].get(k), new[url].get(k))
            for k in sorted(set(old[url]) | set(new[url]))
            if old[url].get(k) != new[url].get(k)
        ]
        for key, before, after in changes:
            out.append(
                failed(
                    GATE,
                    "drift",
                    node,
                    f"{key} changed: {_show(before)} -> {_show(after)} since the baseline {source}",
                    Evidence(node, key, after, f"{_show(before)} (baseline)"),
                    remedy=RENEW,
                )
            )
        if not changes:
            out.append(passed(GATE, "drift", node, f"matches the baseline {source}"))
    return out


def _show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return f"{value:,}"
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else repr(value)


def write(
    path: Path,
    readings: Sequence[NodeReading],
    findings: Sequence[Finding],
    router: str | None,
    unread: Sequence[str],
    *,
    strict: bool = True,
) -> Finding:
    """--write-baseline: record the run only if it passed. A failed, broken or inconclusive run never
    becomes the next run's reference: were it written, the same command again (a CI retry, nothing
    reviewed) would compare against the very state that blocked and pass. Nor is a run with an unread
    worker written (a partial baseline would later call it "added"). The finding says what happened
    and, when nothing was written, that the file was left as it was and why. A file that cannot be
    written fails."""
    node = str(path)
    kept = f"{path} left as it was" if path.exists() or path.is_symlink() else "nothing written"
    if unread:
        return inconclusive(
            GATE,
            "write",
            node,
            f"baseline not renewed ({kept}): {len(unread)} worker(s) could not be read "
            f"({', '.join(sorted(unread)[:3])}{' ...' if len(unread) > 3 else ''})",
            remedy="re-run once every worker answers",
        )
    if not readings:
        return inconclusive(GATE, "write", node, f"baseline not renewed ({kept}): no worker was read")
    status = exit_status_for(list(findings), strict)
    if status is not ExitStatus.PASSED:
        counted = [f for f in findings if f.counts_toward_exit]
        blocking = [f for f in counted if f.outcome in (Outcome.FAILED, Outcome.ERROR)] or [
            f for f in counted if f.outcome is Outcome.INCONCLUSIVE
        ]
        named = ", ".join(dict.fromkeys(f.test_id for f in blocking[:5]))
        return inconclusive(
            GATE,
            "write",
            node,
            f"baseline not renewed ({kept}): this run did not pass (exit {int(status)}, {status.name.lower()}: "
            f"{len(blocking)} blocking finding(s), {named}{' ...' if len(blocking) > 5 else ''}); "
            "a run that did not pass never becomes the next run's reference",
            remedy="resolve or review what blocked, then renew with a run that passes: "
            "kvgate check ... --write-baseline FILE",
        )
    try:
        save(record(readings, findings, router), path)
    except OSError as exc:
        return failed(GATE, "write", node, f"baseline not written: {exc}", remedy="check the path and permissions")
    doubt = sum(1 for f in findings if f.counts_toward_exit and f.outcome is Outcome.INCONCLUSIVE)
    how = f"; strictness opted out: {doubt} inconclusive check(s) did not block" if doubt else ""
    return passed(GATE, "write", node, f"baseline of {len(readings)} worker(s) written to {path} (the run passed{how})")
