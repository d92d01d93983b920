"""Reading the code a server runs: one scan request, run in-process, in a git commit or on a remote host.

The request is built here from the catalogue's signatures and the backport series' code signatures;
`scanprog` answers it. `--site-packages PATH` runs it in-process, `--python CMD` sends the program on
the standard input of CMD (a plain interpreter, or `kubectl exec -i POD -- python3`, `docker exec -i
C python3`, `ssh host python3`), a git checkout is read blob by blob. Every way ends in a `CodeScan`,
so the assessment after it is the same function whatever the source.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.catalogue import scanprog
from kvgate.catalogue.model import Catalogue, Signature
from kvgate.catalogue.series import Series, available, load_series
from kvgate.catalogue.signatures import SourceTree, glob_regex
from kvgate.defaults import SCAN_TIMEOUT_S  # one home: kvgate/defaults.py (re-exported here)
from kvgate.errors import TransportError, UsageError
from kvgate.output.redact import clip

SCAN_OUTPUT_LIMIT = 2 * 1024 * 1024  # bytes of stdout; the answer is a few kB


def pattern_of(sig: Signature) -> str:
    """The scan program's pattern string for a catalogue signature."""
    return sig.scan_pattern


def code_pattern(code: str) -> str:
    """A backport's code line: in code the interpreter runs, a string literal included (some lines are
    the messages it logs); a comment or a docstring never counts."""
    return f"asub:{code}"


def all_series() -> tuple[Series, ...]:
    """Every backport series shipped under backports/."""
    return tuple(load_series(r) for r in available())


def build_request(cat: Catalogue, series: tuple[Series, ...]) -> dict[str, Any]:
    """What to read: each catalogue signature's file or glob, and each backport file's code signatures."""
    files: dict[str, list[str]] = {}
    globs: list[dict[str, str]] = []
    for fix in cat.fixes:
        for sig in fix.signatures:
            if sig.is_glob:
                globs.append(
                    {"id": glob_id(sig), "path_regex": glob_regex(sig.file).pattern, "pattern": pattern_of(sig)}
                )
            else:
                files.setdefault(sig.file, []).append(pattern_of(sig))
    for s in series:
        for p in s.patches:
            for f in p.files:
                files.setdefault(f.site_path[len("sglang/") :], []).extend(code_pattern(c) for c in f.code)
    return {"files": {k: sorted(set(v)) for k, v in files.items()}, "globs": list({g["id"]: g for g in globs}.values())}


def glob_id(sig: Signature) -> str:
    return f"{sig.file} {pattern_of(sig)}"


@dataclass(frozen=True)
class FileFacts:
    """One file of the scanned package: its sha256 and which requested patterns it carries."""

    sha256: str
    hits: Mapping[str, bool]
    markers: tuple[str, ...]


@dataclass(frozen=True)
class CodeScan:
    """What a scan of one sglang package found. `files[rel]` is None when the file does not exist."""

    source: str  # how the code was reached: "--site-packages PATH", "--python 'CMD'", "git ..."
    package_dir: Path
    found_by: str
    version: str | None
    files: Mapping[str, FileFacts | None]
    globs: Mapping[str, tuple[str, ...]]
    markers: Mapping[str, tuple[str, ...]]
    python: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def hit(self, rel: str, pattern: str) -> bool | None:
        """Whether file `rel` carries `pattern`; None when the file is missing or was not asked about."""
        facts = self.files.get(rel)
        if facts is None or pattern not in facts.hits:
            return None
        return facts.hits[pattern]


def parse_answer(doc: Any, where: str) -> CodeScan:
    """Validate the scan program's JSON answer; anything malformed is a TransportError naming `where`."""
    if not isinstance(doc, dict) or doc.get("kvgate_scan") != scanprog.SCAN_SCHEMA:
        raise TransportError(where, "the answer is not a kvgate code scan (schema mismatch)")
    if doc.get("error"):
        raise UsageError(f"{where}: {doc['error']}")
    try:
        files: dict[str, FileFacts | None] = {}
        for rel, f in dict(doc["files"]).items():
            if f is None:
                files[str(rel)] = None
                continue
            hits = {str(k): bool(v) for k, v in dict(f["hits"]).items()}
            files[str(rel)] = FileFacts(str(f["sha256"]), hits, tuple(str(m) for m in f.get("markers") or ()))
        globs = {str(k): tuple(str(x) for x in v) for k, v in dict(doc.get("globs") or {}).items()}
        markers = {str(k): tuple(str(x) for x in v) for k, v in dict(doc.get("markers") or {}).items()}
        version = doc.get("version")
        return CodeScan(
            source=where,
            package_dir=Path(str(doc["package_dir"])),
            found_by=str(doc.get("found_by")),
            version=str(version) if version is not None else None,
            files=files,
            globs=globs,
            markers=markers,
            python=doc.get("python"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TransportError(where, f"malformed kvgate code scan: {type(exc).__name__}: {exc}") from None


def scan_site_packages(path: Path, cat: Catalogue, series: tuple[Series, ...] | None = None) -> CodeScan:
    """The scan of a site-packages folder (or the sglang/ folder itself), in this process."""
    path = Path(path).expanduser()
    where = f"--site-packages {path}"
    if not path.exists():
        raise UsageError(f"{where}: no such directory")
    doc = scanprog.scan(build_request(cat, series if series is not None else all_series()), root=str(path))
    if doc.get("error"):
        raise UsageError(f"{where}: no sglang package there (expected {path}/sglang/srt)")
    return parse_answer(doc, where)


def _run_bounded(argv: list[str], stdin: bytes, timeout: float, limit: int) -> tuple[int | None, bytes, bytes, str]:
    """Run argv with `stdin`; returns (exit code or None, stdout, stderr tail, problem or '').

    The command runs in its own session so a hang kills its children too; stdout beyond `limit`
    bytes stops the run.
    """
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    out = bytearray()
    err = bytearray()
    problem: list[str] = []

    def pump_out() -> None:
        assert proc.stdout is not None
        while True:
            chunk = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else proc.stdout.read(65536)
            if not chunk:
                return
            out.extend(chunk)
            if len(out) > limit:
                problem.append(f"printed more than {limit} bytes")
                _kill(proc)
                return

    def pump_err() -> None:
        assert proc.stderr is not None
        for chunk in iter(lambda: proc.stderr.read(4096), b""):  # type: ignore[union-attr]
            err.extend(chunk)
            del err[:-8192]

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    threads = [threading.Thread(target=t, daemon=True) for t in (pump_out, pump_err, feed)]
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        problem.append(f"no answer within {timeout:g} s (killed)")
        _kill(proc)
        proc.wait()
    for t in threads:
        t.join(timeout=5)
    return (None if problem else proc.returncode), bytes(out), bytes(err), "; ".join(problem)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def command_argv(command: str) -> list[str]:
    """Split a --python command line (shell quoting); empty or unbalanced quotes are a usage error."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--python {command!r}: cannot split the command line ({exc})") from None
    if not argv:
        raise UsageError("--python: empty command")
    return argv


def _ask(argv: list[str], where: str, program: str, timeout: float, limit: int) -> Any:
    """Run `program` on the stdin of `argv` and return the JSON document it answers with.

    A command that cannot start, fails, hangs or answers garbage is a TransportError naming `where`.
    """
    try:
        code, out, err, problem = _run_bounded(argv, program.encode("utf-8"), timeout, limit)
    except FileNotFoundError:
        raise TransportError(where, f"cannot run {argv[0]!r}: no such program") from None
    except OSError as exc:
        raise TransportError(where, f"cannot run {argv[0]!r}: {exc}") from None
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no stderr"]
    if problem:
        raise TransportError(where, f"{problem}; stderr: {tail[0]}")
    if code != 0:
        raise TransportError(where, f"exited {code}; stderr: {tail[0]}")
    text = out.decode("utf-8", "replace")
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and '"kvgate_scan"' in line:
            try:
                return json.loads(line)
            except ValueError:
                break
    shown = clip(text.strip(), 120) or "nothing"
    raise TransportError(where, f"did not answer with a kvgate code scan on stdout (got {shown!r})")


def scan_command(
    command: str,
    cat: Catalogue,
    series: tuple[Series, ...] | None = None,
    *,
    timeout: float = SCAN_TIMEOUT_S,
    limit: int = SCAN_OUTPUT_LIMIT,
) -> CodeScan:
    """Run the scan program through `command` (its stdin); a command that fails, hangs or answers
    garbage is a TransportError naming it (exit 4)."""
    where = f"--python {command!r}"
    program = scanprog.program_text(build_request(cat, series if series is not None else all_series()))
    return parse_answer(_ask(command_argv(command), where, program, timeout, limit), where)


def locate_package(interpreter: str, *, timeout: float = SCAN_TIMEOUT_S) -> Path:
    """The `sglang/` package directory `interpreter` imports, found without importing it.

    The one "where is sglang in this interpreter" helper: scanprog.find_package, run in that
    interpreter like a scan, with its own environment (PYTHONPATH and user site-packages count, as
    they do for the server it runs; an isolated `-I` run would miss an overlay on PYTHONPATH).
    A failing interpreter is a TransportError (exit 4); one without sglang, a UsageError (exit 2).
    """
    where = f"--python {interpreter!r}"
    doc = _ask([interpreter], where, scanprog.locate_text(), timeout, SCAN_OUTPUT_LIMIT)
    if not isinstance(doc, dict) or doc.get("kvgate_scan") != scanprog.SCAN_SCHEMA:
        raise TransportError(where, "the answer is not a kvgate code scan (schema mismatch)")
    if doc.get("error") or not doc.get("package_dir"):
        raise UsageError(f"{where}: {doc.get('error') or 'no sglang package found'}")
    return Path(str(doc["package_dir"]))


def scan_tree(
    tree: SourceTree,
    where: str,
    package_dir: Path,
    version: str | None,
    cat: Catalogue,
    series: tuple[Series, ...] | None = None,
) -> CodeScan:
    """The same facts from a SourceTree (a git commit): files read one by one, globs and markers by search."""
    req = build_request(cat, series if series is not None else all_series())
    files = {}
    for rel, pats in req["files"].items():
        data = tree.read_bytes(rel)
        facts = scanprog.file_facts(data, pats)
        files[rel] = None if facts is None else FileFacts(facts["sha256"], facts["hits"], tuple(facts["markers"]))
    sigs = [s for f in cat.fixes for s in f.signatures if s.is_glob]
    marker_sig = Signature(file="**/*.py", substring=scanprog.MARKER_PREFIX, context="text")
    found = tree.search_globs(list(dict.fromkeys(sigs + [marker_sig])))
    markers: dict[str, list[str]] = {}
    for rel in found.get(marker_sig, ()):
        for pid in scanprog.markers_in(tree.read_bytes(rel) or b""):
            markers.setdefault(pid, []).append(rel)
    globs = {glob_id(s): found.get(s, ()) for s in sigs}
    return CodeScan(
        source=where,
        package_dir=package_dir,
        found_by=where,
        version=version,
        files=files,
        globs=globs,
        markers={k: tuple(v) for k, v in markers.items()},
    )
