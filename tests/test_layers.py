"""Imports flow down: every module of kvgate imports only its own layer and the layers below it.

Every import counts, including the late ones inside functions and those under `if TYPE_CHECKING:`;
a late import hides a cycle from Python, not from this test. ARCHITECTURE.md describes the layers in
words; this table is the one that is enforced.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kvgate"

# Bottom first. A module belongs to the layer of the longest entry that names it or a package above it
# ("kvgate" alone is only the package's own __init__: the version).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # What every layer needs, at the package's root: the version, exit codes, errors, defaults, where data
    # and cache live, the optional extras.
    ("core", ("kvgate", "kvgate.exitcodes", "kvgate.errors", "kvgate.defaults", "kvgate.paths", "kvgate.extras")),
    # What leaves the process: redaction, safe writes, the output boundary and its sinks, progress.
    ("output", ("kvgate.output",)),
    # SGLang's own releases: the real wheels and facts read from them, the admission limits.
    ("upstream", ("kvgate.upstream",)),
    # Starting processes: the supervisor and the one PD start sequence (workers, then the real router).
    ("deploy", ("kvgate.deploy",)),
    # What the workers and the router say about themselves, over HTTP whose every answer is bounded.
    ("reading", ("kvgate.reading",)),
    # Results: frozen findings and the report, waivers over them, the baseline file.
    ("results", ("kvgate.results",)),
    # Knowledge the gates apply: the fix catalogue (and backport series as data), pool sizing.
    ("knowledge", ("kvgate.catalogue", "kvgate.plan")),
    # The gates, and the gate profiles that configure them.
    ("gates", ("kvgate.gates",)),
    # Acting on an sglang tree, the real server on CPU, the simulator, the launch plan of real workers. A
    # gate never starts anything: these sit above the gates, and the pipeline composes them.
    ("backport", ("kvgate.backport",)),
    ("cpuserver", ("kvgate.cpuserver",)),
    ("sim", ("kvgate.sim",)),
    ("launch", ("kvgate.deploy.launch",)),
    # The pipeline: target -> gates -> findings (and the self-test's positive control).
    ("pipeline", ("kvgate.pipeline",)),
    # Rendering a report and writing it; the check-ID pages its links point to.
    ("report", ("kvgate.formats",)),
    # `kvgate watch`: the pipeline and the report on a loop, metrics and a verdict over HTTP.
    ("watch", ("kvgate.watch",)),
    # `kvgate soak`: sustained load with the gate's and the watch's content checks interleaved.
    ("soak", ("kvgate.soak",)),
    ("commands", ("kvgate.commands",)),
    ("cli", ("kvgate.cli",)),
)

_RANK = {name: i for i, (name, _) in enumerate(LAYERS)}

# Inside a gate package (kvgate/gates/defenses/): each check module reads the shared `common` (and
# `code`, where the code each node runs is read) and never another check; `gate` composes them.
GATE_PACKAGE_CHECKS = {
    "kvgate.gates.defenses": ("release", "deferred", "checksum", "canary"),
}
GATE_PACKAGE_SHARED = ("common", "code", "options")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    best: tuple[int, str] | None = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            hit = module == prefix if prefix == "kvgate" else module == prefix or module.startswith(prefix + ".")
            if hit and (best is None or len(prefix) > best[0]):
                best = (len(prefix), name)
    return best[1] if best else None


def imports_of(module: str, path: Path) -> set[str]:
    """Every kvgate module `module` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in MODULES else base)  # `from kvgate import baseline` is a module
    return {m for m in out if m == "kvgate" or m.startswith("kvgate.")}


def upward_imports() -> dict[tuple[str, str], tuple[str, str]]:
    found = {}
    for module, path in MODULES.items():
        mine = layer_of(module)
        assert mine is not None
        for dep in imports_of(module, path):
            theirs = layer_of(dep)
            assert theirs is not None, f"{module} imports {dep}, which is in no layer"
            if _RANK[theirs] > _RANK[mine]:
                found[(module, dep)] = (mine, theirs)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert not unplaced, f"add these modules to a layer in tests/test_layers.py and ARCHITECTURE.md: {unplaced}"


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = upward_imports()
    assert not bad, "\n".join(f"{m} ({a}) imports {d} ({b}), a layer above" for (m, d), (a, b) in sorted(bad.items()))


def test_the_checker_sees_late_imports() -> None:
    """The check itself: a late import inside a function is found like a top-level one."""
    deps = imports_of("kvgate.commands.fixes", MODULES["kvgate.commands.fixes"])
    assert "kvgate.catalogue" in deps and "kvgate.backport.probe" in deps


def test_architecture_md_names_every_layer_and_only_files_that_exist() -> None:
    """ARCHITECTURE.md describes this table and this tree: every layer is in it, every file it names exists."""
    import re

    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = {m.group(1) for m in re.finditer(r"^\| (\w+) \|", text, flags=re.M)}
    assert {name for name, _ in LAYERS} <= rows, f"layers missing from ARCHITECTURE.md: {set(dict(LAYERS)) - rows}"
    named = {
        t
        for t in re.findall(r"`([^`\s]+)`", text)
        if ("/" in t or t.endswith(".py")) and not re.search(r"[<>*]|^(srt/|python/|/)", t)
    }
    missing = [t for t in sorted(named) if not (ROOT / t).exists() and not (PACKAGE / t).exists()]
    assert not missing, f"ARCHITECTURE.md names files that do not exist: {missing}"


def test_checks_of_a_gate_package_do_not_import_each_other() -> None:
    for package, checks in GATE_PACKAGE_CHECKS.items():
        shared = {f"{package}.{m}" for m in GATE_PACKAGE_SHARED}
        for check in checks:
            module = f"{package}.{check}"
            deps = {d for d in imports_of(module, MODULES[module]) if d.startswith(package + ".")}
            assert deps <= shared, f"{module} imports {sorted(deps - shared)}: checks share only {sorted(shared)}"


def import_cycles() -> list[list[str]]:
    """Every strongly connected group of two or more modules in the import graph (late imports too)."""
    graph = {m: sorted(d for d in imports_of(m, p) if d in MODULES and d != m) for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return groups


def test_no_module_imports_a_module_that_imports_it() -> None:
    """No import cycle anywhere in the package, inside a layer too, at any distance."""
    assert not import_cycles(), "import cycles: " + "; ".join(" <-> ".join(g) for g in import_cycles())


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    """The check itself: two modules that import each other are a cycle it reports."""
    saved = dict(MODULES)
    try:
        tmp = tmp_path
        (tmp / "a.py").write_text("from kvgate.cycleprobe_b import x\n")
        (tmp / "b.py").write_text("import kvgate.cycleprobe_a\n")
        MODULES["kvgate.cycleprobe_a"] = tmp / "a.py"
        MODULES["kvgate.cycleprobe_b"] = tmp / "b.py"
        assert ["kvgate.cycleprobe_a", "kvgate.cycleprobe_b"] in import_cycles()
    finally:
        MODULES.clear()
        MODULES.update(saved)


#: Modules allowed over MAX_LINES, each with the reason. None today.
LONG_MODULES: dict[str, str] = {}
MAX_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    unexplained = {m: n for m, n in long.items() if m not in LONG_MODULES}
    assert not unexplained, f"split these modules along a named seam (at most {MAX_LINES} lines): {unexplained}"
