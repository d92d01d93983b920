"""Where each node's code is read, and whether a scan vouches for a node.

Sources: `--site-packages PATH` / `--python COMMAND` on `check` (key `*`, every node), or a profile's
`code:` entries per role or node URL. A `python` command may be a template: `{url}`, `{role}`,
`{index}`, `{host}` and `{port}` are replaced by each node's own (e.g. `kubectl exec -i {role}-{index}
-- python3`, `ssh {host} python3`), so each node's own interpreter is read. Each distinct command is
run once.

A scan vouches for a node only if it is that node's code (`vouch`, the one rule):
- a scan that stands for one node only (a template that names the node, a URL entry, a role entry or
  a plain command when that node is the only one using it) counts, unless the version the node
  reports differs from the version the scanned package declares. Where the source names the node
  itself (a template with `{url}`, `{index}`, `{host}` or `{port}`, or a profile entry for its URL),
  the operator has said this is the node's code, and the node says it is another release: the
  finding says so plainly, names what the scanned code lacks (`code_scan`), tells how to check that
  the scan reached the server's own interpreter, and blocks whatever the strictness (`mismatch`).
  Otherwise it is some other package;
- a scan that stands for several nodes (one plain `--python` or `--site-packages` for a whole fleet)
  counts for a node only when both versions are known and equal. Otherwise it is set aside for that
  node and named (`code_doubt`), and the node is judged on its version string, which never passes
  (kvgate.gates.defenses.release).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from kvgate.catalogue import assess_code, load_catalogue, parse_release
from kvgate.catalogue.codescan import SCAN_TIMEOUT_S, CodeScan, command_argv, scan_command, scan_site_packages
from kvgate.errors import KvgateError, ProfileError, UsageError
from kvgate.gates.defenses.common import DefenseInputs, backend_of, inputs_from_reading
from kvgate.output.progress import Observer
from kvgate.reading.node import NodeReading, NodeSpec

#: What a `python` template may name; `{role}` alone names a role, the others one node.
PLACEHOLDERS = ("url", "role", "index", "host", "port")
_PER_NODE = ("url", "index", "host", "port")
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# What a node's value may contain to be put into a command line (a router may list any URL).
_SAFE = re.compile(r"[A-Za-z0-9._:/@%+\-\[\]]+")
MAX_PARALLEL_SCANS = 8


@dataclass(frozen=True)
class CodeSource:
    """Where the code of a node is read: a site-packages folder here, or a command running its Python."""

    site_packages: str | None = None
    python: str | None = None
    timeout: float = SCAN_TIMEOUT_S  # seconds the --python command may take

    def describe(self) -> str:
        return f"--site-packages {self.site_packages}" if self.site_packages else f"--python {self.python!r}"

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_FIELD.findall(self.python or "")))

    def for_node(self, spec: NodeSpec) -> CodeSource:
        """This source with the node's values in its template; UsageError when a value is unsafe there."""
        if not self.placeholders:
            return self
        parts = urlsplit(spec.url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
        values = {"url": spec.url, "role": spec.role, "index": str(spec.index), "host": parts.hostname or ""}
        values["port"] = str(port)
        for name in self.placeholders:
            if not _SAFE.fullmatch(values[name]):  # fullmatch: `$` would allow a trailing newline
                raise UsageError(
                    f"{self.describe()}: this node's {{{name}}} ({values[name]!r}) is not safe in a command"
                )
        return replace(self, python=_FIELD.sub(lambda m: values[m.group(1)], self.python or ""))

    def scan(self) -> CodeScan:
        cat = load_catalogue()
        if self.site_packages:
            return scan_site_packages(Path(self.site_packages), cat)
        return scan_command(str(self.python), cat, timeout=self.timeout)


def _check_template(key: str, text: str, where: str) -> None:
    unknown = sorted({n for n in _FIELD.findall(text) if n not in PLACEHOLDERS})
    if unknown:
        problem = (
            f"unknown placeholder {{{unknown[0]}}} in {text!r}; a command may name {{{'}, {'.join(PLACEHOLDERS)}}}"
        )
        if key == "*":
            raise UsageError(f"--python: {problem}")
        raise ProfileError(where, f"code.{key}.python", problem)


def code_sources(section: Mapping[str, object], where: str = "profile") -> dict[str, CodeSource]:
    """Validate a `code:` mapping: keys `*` (every node), `prefill`, `decode` or a node URL; each value
    has exactly one of `site_packages` / `python`, and optionally `timeout` (ProfileError if bad)."""
    out: dict[str, CodeSource] = {}
    for key, value in section.items():
        k = str(key).rstrip("/")
        if not (k in ("*", "prefill", "decode") or k.startswith(("http://", "https://"))):
            raise ProfileError(where, f"code.{key}", "expected prefill, decode or a node URL")
        if (
            not isinstance(value, Mapping)
            or set(value) - {"site_packages", "python", "timeout"}
            or len(set(value) & {"site_packages", "python"}) != 1
        ):
            raise ProfileError(
                where,
                f"code.{key}",
                "expected a mapping with exactly one of site_packages, python (and optionally timeout)",
            )
        timeout = value.get("timeout", SCAN_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ProfileError(where, f"code.{key}.timeout", f"expected a number of seconds > 0, got {timeout!r}")
        kind = "site_packages" if "site_packages" in value else "python"
        text = value[kind]
        if not isinstance(text, str) or not text.strip():
            raise ProfileError(where, f"code.{key}.{kind}", f"expected a non-empty string, got {text!r}")
        if kind == "site_packages":
            if not Path(text).expanduser().is_dir():
                raise ProfileError(where, f"code.{key}.site_packages", f"{text}: no such directory")
            out[k] = CodeSource(site_packages=text, timeout=float(timeout))
        else:
            command_argv(text)  # unbalanced quotes are a usage error now, not a failed scan later
            _check_template(k, text, where)
            out[k] = CodeSource(python=text, timeout=float(timeout))
    return out


def source_for(sources: Mapping[str, CodeSource], url: str, role: str) -> CodeSource | None:
    """The code source of one node: the flags' (`*`) win, then its URL, then its role."""
    return sources.get("*") or sources.get(url.rstrip("/")) or sources.get(role)


def _same_version(a: str, b: str) -> bool:
    try:
        return parse_release(a).version == parse_release(b).version
    except UsageError:
        return a.strip() == b.strip()


def vouch(reported: str | None, scanned: str | None, source: str, shared_by: int) -> str | None:
    """None when a scan is evidence for a node; else why it is not (the one rule, see the module doc)."""
    if reported and scanned and not _same_version(reported, scanned):
        return (
            f"the code read through {source} declares sglang {scanned}, but this node reports {reported}: "
            "that is not this node's code, so it is not counted"
        )
    if shared_by > 1 and not reported:
        return (
            f"one scan ({source}) stands for {shared_by} nodes and this node reports no version to match "
            "it with: not counted"
        )
    if shared_by > 1 and not scanned:
        return (
            f"one scan ({source}) stands for {shared_by} nodes and its package declares no version to match "
            f"this node's {reported} with: not counted"
        )
    return None


#: How to tell whether a --python command reached the interpreter the server runs in.
CHECK_THE_SCAN = (
    "check that the command reaches the server's own interpreter: run it with "
    "-c 'import sglang, sys; print(sglang.__version__, sglang.__file__, sys.executable)' and compare with "
    "the server process (its /proc/<pid>/exe and the sglang path in its tracebacks or logs); a sidecar, "
    "an init container or a second virtualenv answers with other code"
)


def mismatch(reported: str, scanned: str, source: str) -> str:
    """The plain statement for a node whose own scan declares another release than it reports."""
    return (
        f"this node reports sglang {reported} but runs {scanned}: its own code, read through {source}, "
        f"declares {scanned}"
    )


def names_node(sources: Mapping[str, CodeSource], spec: NodeSpec) -> bool:
    """Whether the node's source was named for this node alone: a template with a per-node placeholder,
    or a profile entry for its URL (the flags' `*` wins over both, as in `source_for`)."""
    src = source_for(sources, spec.url, spec.role)
    if src is None:
        return False
    if any(p in _PER_NODE for p in src.placeholders):
        return True
    return "*" not in sources and sources.get(spec.url.rstrip("/")) is src


def read_code(
    readings: Sequence[NodeReading], sources: Mapping[str, CodeSource], observer: Observer
) -> list[DefenseInputs]:
    """Each node's inputs, with the code that vouches for it (or why none does)."""
    rendered: list[CodeSource | str | None] = []
    for r in readings:
        src = source_for(sources, r.spec.url, r.spec.role)
        try:
            rendered.append(src.for_node(r.spec) if src is not None else None)
        except UsageError as exc:
            rendered.append(str(exc))
    users: dict[CodeSource, int] = {}
    for s in rendered:
        if isinstance(s, CodeSource):
            users[s] = users.get(s, 0) + 1
    for src, count in users.items():
        observer.log(f"reading the code of {count} node(s) through {src.describe()}")
    scans: dict[CodeSource, CodeScan | str] = {}
    if users:
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_SCANS, len(users))) as pool:
            for src, got in zip(users, pool.map(_scan, users), strict=True):
                scans[src] = got
    out: list[DefenseInputs] = []
    for r, s in zip(readings, rendered, strict=True):
        n = inputs_from_reading(r)
        if isinstance(s, str):
            n = replace(n, code_error=s)
        elif s is not None:
            got = scans[s]
            if isinstance(got, str):
                n = replace(n, code_error=got)
            else:
                doubt = vouch(n.version, got.version, s.describe(), users[s])
                if doubt is not None and users[s] == 1 and n.version and got.version and names_node(sources, r.spec):
                    # The operator named this scan this node's code: say what it is, and what it lacks.
                    n = replace(
                        n,
                        code_doubt=mismatch(n.version, got.version, s.describe()),
                        code_scan=assess_code(got, backend=backend_of(n)),
                    )
                elif doubt is not None:
                    n = replace(n, code_doubt=doubt)
                else:
                    n = replace(n, fixes=assess_code(got, backend=backend_of(n)), code_shared_by=users[s])
        out.append(n)
    return out


def _scan(src: CodeSource) -> CodeScan | str:
    try:
        return src.scan()
    except KvgateError as exc:
        return str(exc)
