"""Every write kvgate makes is listed here, and every one that emits goes through the output boundary.

The boundary is kvgate/output/sinks.py (redaction of every secret and its derived forms, the step-output
defanging). This test reads every module of kvgate/ and tools/ and lists each call that writes bytes
somewhere (print, echo, a stream's or file's write, write_atomic, a Rich console's print): each must
be in BOUNDARY (it is the boundary, or writes only what the boundary made) or in NOT_OUTPUT (it writes
no output a person or a CI system reads: a cache marker, a patched file, bytes to a subprocess), with
its count. A new write anywhere fails here until it is routed through `kvgate.output.sinks` or listed with its
reason.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_NAMES = {"print", "typer.echo", "typer.secho", "click.echo", "os.write", "write_atomic", "write_temp", "write_output"}
_SUFFIXES = (".write", ".writelines", ".write_text", ".write_bytes", ".sendall")
_CONSOLE = ("console.print", "console.log", "console.rule", "self.console.log", "self.console.print")

# (file, callee) -> (count, why it is the boundary or writes only what the boundary made)
BOUNDARY: dict[tuple[str, str], tuple[int, str]] = {
    ("kvgate/output/sinks.py", "stream.write"): (1, "write_stream: the boundary itself"),
    ("kvgate/output/sinks.py", "write_output"): (1, "write_file: the boundary itself"),
    ("kvgate/output/safeio.py", "write_atomic"): (
        2,
        "write_output, called by sinks.write_file with the boundary's bytes",
    ),
    ("kvgate/output/safeio.py", "os.write"): (
        1,
        "write_output in place (FIFO, terminal, descriptor): the boundary's bytes",
    ),
    ("kvgate/output/progress.py", "self.stream.write"): (1, "a BoundaryStream"),
    ("kvgate/output/progress.py", "self.console.log"): (1, "a Console over a BoundaryStream"),
    ("kvgate/formats/table.py", "console.print"): (13, "renders into a buffer; reporting.emit writes it"),
    ("kvgate/formats/table.py", "console.rule"): (1, "renders into a buffer; reporting.emit writes it"),
    ("kvgate/pipeline/check.py", "baseline.write"): (
        1,
        "kvgate.results.baseline.save: sinks.write_file of a redacted document",
    ),
    ("kvgate/watch/endpoint.py", "writer.write"): (3, "h11 framing of an Answer whose body is sinks.http_body"),
    ("tools/gha_report.py", "sys.stdout.write"): (1, "annotations built by sinks.workflow_data/_property"),
    ("tools/gha_report.py", "dst.write"): (1, "the step summary, each line through sinks.visible"),
}

# (file, callee) -> (count, why it is not an output)
NOT_OUTPUT: dict[tuple[str, str], tuple[int, str]] = {
    ("kvgate/output/safeio.py", "fh.write"): (1, "write_atomic's own temp file"),
    ("kvgate/output/safeio.py", "write_temp"): (1, "write_atomic's own temp file"),
    ("kvgate/reading/httpbounds.py", "self._inner.write"): (1, "a request's bytes to a server"),
    ("kvgate/catalogue/codescan.py", "proc.stdin.write"): (1, "the scan request to a subprocess"),
    ("kvgate/catalogue/scanprog.py", "sys.stdout.write"): (2, "runs in the scanned interpreter; kvgate parses it"),
    ("kvgate/backport/_probe_payload.py", "print"): (1, "runs in the probe's interpreter; kvgate parses it"),
    ("kvgate/backport/_lifetime_payload.py", "print"): (1, "runs in the probe's interpreter; kvgate parses it"),
    ("kvgate/backport/_lifetime_races.py", "pair.pool.write"): (1, "a simulated KV pool, not a file"),
    ("kvgate/backport/_lifetime_pair.py", "self.pool.write"): (1, "a simulated KV pool, not a file"),
    ("kvgate/backport/journal.py", "write_atomic"): (2, "a backport's staged bytes and a recovered sglang file"),
    ("kvgate/backport/journal.py", "write_temp"): (2, "the journal's intent record and a patched sglang file"),
    ("kvgate/backport/gitjournal.py", "write_atomic"): (1, "the --repo journal's intent record"),
    ("kvgate/backport/cpuenv.py", "write_atomic"): (4, "cache markers of a built environment"),
    ("kvgate/backport/cpuenv.py", "print"): (1, "developer tool (python -m): an environment's own paths"),
    ("kvgate/backport/regen.py", "print"): (2, "developer tool (python -m): usage and the manifest path"),
    ("kvgate/backport/regen.py", "sys.stdout.write"): (1, "developer tool (python -m): a manifest from wheels"),
    ("kvgate/backport/regen.py", "write_atomic"): (1, "developer tool (python -m): a manifest from wheels"),
    ("kvgate/cpuserver/env.py", "write_atomic"): (2, "cache markers"),
    ("kvgate/cpuserver/model.py", "write_atomic"): (1, "a cache marker"),
    ("kvgate/upstream/releases.py", "write_atomic"): (1, "a cache marker"),
    ("kvgate/sim/__main__.py", "sys.stderr.write"): (1, "the simulator worker's fixed usage line"),
    ("kvgate/sim/deploy.py", "spec.write_text"): (1, "the simulated fleet's spec for its own processes"),
    ("kvgate/sim/transfer.py", "writer.write"): (2, "the simulated KV transfer between simulated workers"),
    ("tools/binary_main.py", "sys.stderr.write"): (1, "the launcher's fixed too-old-Python line, before kvgate"),
    ("tools/build_binary.py", "print"): (1, "build tool: the built file's path and size"),
    ("tools/busy_run.py", "print"): (2, "test tool: its own run lines (status, wall time, load), no server text"),
    ("tools/build_binary.py", "raw.write"): (1, "build tool: the binary's shebang"),
}
for _i in ("config.json", "generation_config.json", "special_tokens_map.json", "tokenizer_config.json"):
    NOT_OUTPUT[("kvgate/cpuserver/_write_model.py", f"(out / '{_i}').write_text")] = (1, "a tiny model's files")


def writes() -> Counter[tuple[str, str]]:
    """Every write call in kvgate/ and tools/, by (file, callee)."""
    found: Counter[tuple[str, str]] = Counter()
    files = sorted([*ROOT.glob("kvgate/**/*.py"), *ROOT.glob("tools/*.py")])
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            callee = ast.unparse(node.func)
            if callee in _NAMES or callee.endswith(_SUFFIXES) or callee in _CONSOLE:
                found[(path.relative_to(ROOT).as_posix(), callee)] += 1
    return found


def test_every_write_is_the_boundary_or_no_output() -> None:
    listed = {k: n for k, (n, _) in {**BOUNDARY, **NOT_OUTPUT}.items()}
    found = dict(writes())
    new = {k: n for k, n in found.items() if listed.get(k) != n}
    assert not new, (
        f"writes that bypass kvgate.output.sinks (route them through sinks.echo/write_stream/write_file/http_body, "
        f"or list them here with the reason they are no output): {new}"
    )
    gone = {k for k in listed if k not in found}
    assert not gone, f"listed writes no longer in the code (remove them here): {gone}"


def test_the_scan_sees_a_bypass() -> None:
    """The scan is not vacuous: a raw print of server text in a new module is found."""
    tree = ast.parse("def f(x):\n    print(x)\n    sys.stderr.write(x)\n    typer.echo(x, err=True)\n")
    calls = [ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert {c for c in calls if c in _NAMES or c.endswith(_SUFFIXES)} == {"print", "sys.stderr.write", "typer.echo"}


def test_no_module_prints_outside_the_boundary() -> None:
    """Outside the listed files nothing imports a printing path of its own (typer.echo, click.echo)."""
    offenders = []
    for path in ROOT.glob("kvgate/**/*.py"):
        text = path.read_text(encoding="utf-8")
        if "typer.echo(" in text or "click.echo(" in text or "typer.secho(" in text:
            offenders.append(path.relative_to(ROOT).as_posix())
    assert offenders == []
