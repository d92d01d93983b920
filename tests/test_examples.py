"""examples/: every file parses, every `kvgate ...` command line in them parses with kvgate's own CLI,
every profile loads and builds its gates, and the Kubernetes manifests validate against the Kubernetes
schema (shipped offline by kubernetes-validate) or, for CRDs, structurally."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import yaml

from kvgate.cli import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROFILES = EXAMPLES / "profiles"
K8S_VERSION = "1.35.0"
SHELL_OPS = {"&&", "||", ";", "|", ">", ">>", "2>&1", "&"}


def _yaml_files() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".yml", ".yaml"))


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def shell_commands(text: str) -> Iterator[list[str]]:
    """argv of every `kvgate` invocation in shell text (continuations joined, stops at shell operators)."""
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if "kvgate" not in line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        at_start = True
        for i, w in enumerate(words):
            if at_start and (w == "kvgate" or w.endswith("/kvgate")):
                argv: list[str] = []
                for a in words[i + 1 :]:
                    if a in SHELL_OPS:
                        break
                    argv.append(a)
                yield argv
            at_start = w in SHELL_OPS or w in ("then", "do", "exec", "time", "!")


SCRIPT_KEYS = {"run", "script", "before_script", "after_script", "cmd"}  # GitHub, GitLab, Flagger


def action_argv(inputs: dict[str, Any]) -> list[str]:
    """The `kvgate check` command line kvgate's GitHub Action (action.yml) builds from a step's `with:`."""
    argv = ["check"]
    # A workflow expression (`${{ inputs.canary }}`) is one word by the time the action sees it.
    inputs = {k: re.sub(r"\$\{\{.*?\}\}", "EXPR", str(v)) for k, v in inputs.items()}
    for key, flag in (("prefill-urls", "--prefill-url"), ("decode-urls", "--decode-url")):
        argv += [a for u in str(inputs.get(key, "")).split() for a in (flag, u)]
    for key, flag in (("router-url", "--router-url"), ("profile", "--profile"), ("token-env", "--token-env")):
        if inputs.get(key):
            argv += [flag, str(inputs[key])]
    strict = str(inputs.get("strict", "")).lower()
    argv += {"true": ["--strict"], "false": ["--no-strict"]}.get(strict, [])
    return argv + shlex.split(str(inputs.get("args", "")))


def _uses_kvgate_action(step: dict[str, Any]) -> bool:
    uses = str(step.get("uses", ""))
    return uses.split("@")[0].endswith("/kvgate") or uses in ("./", ".")


def _strings_and_containers(node: Any, shell: bool = False) -> Iterator[tuple[str, Any]]:
    """Shell text under script keys, argv of containers whose command is kvgate, and of steps that use
    kvgate's GitHub Action."""
    if isinstance(node, dict):
        if node.get("command") == ["kvgate"] or node.get("command") == "kvgate":
            yield "argv", [str(a) for a in node.get("args", [])]
        if _uses_kvgate_action(node):
            yield "argv", action_argv(node.get("with") or {})
        for k, v in node.items():
            yield from _strings_and_containers(v, shell or k in SCRIPT_KEYS)
    elif isinstance(node, list):
        for v in node:
            yield from _strings_and_containers(v, shell)
    elif isinstance(node, str) and shell:
        yield "shell", node


def example_commands() -> list[tuple[str, list[str]]]:
    """(file, argv) of every kvgate command line in examples/: YAML values, k8s containers, README and
    Dockerfile shell lines."""
    out: list[tuple[str, list[str]]] = []
    for path in _yaml_files():
        for doc in _docs(path):
            for kind, value in _strings_and_containers(doc):
                if kind == "argv":
                    out.append((str(path.relative_to(ROOT)), value))
                else:
                    out += [(str(path.relative_to(ROOT)), argv) for argv in shell_commands(value)]
    for path in sorted(EXAMPLES.rglob("*.md")):
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", path.read_text(), flags=re.S):
            out += [(str(path.relative_to(ROOT)), argv) for argv in shell_commands(block)]
    for path in sorted(EXAMPLES.rglob("Dockerfile")):
        for line in path.read_text().splitlines():
            if line.startswith("RUN "):
                out += [(str(path.relative_to(ROOT)), argv) for argv in shell_commands(line[4:])]
    return out


def parse(argv: list[str]) -> Any:
    """Run argv through kvgate's CLI parser (no command runs); a bad command, flag or value raises."""
    cmd: Any = typer.main.get_command(app)
    ctx = None
    name, rest = "kvgate", list(argv)
    while hasattr(cmd, "resolve_command") and rest and not rest[0].startswith("-"):
        ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
        name, cmd, rest = cmd.resolve_command(ctx, rest)
    try:
        return cmd.make_context(name, rest, parent=ctx)
    except typer.Exit as done:  # an eager --version / --help parsed fine and exits 0
        assert done.exit_code == 0, argv
        return None


def profile_file(ref: str) -> Path:
    """Examples name profiles where the image or checkout puts them; the file is examples/profiles/NAME."""
    path = PROFILES / Path(ref).name
    assert path.is_file(), f"--profile {ref}: no examples/profiles/{Path(ref).name}"
    return path


def test_every_example_file_parses() -> None:
    files = _yaml_files()
    assert len(files) >= 7, files
    for path in files:
        assert _docs(path), f"{path} is empty"
    for folder in ("github-actions", "gitlab-ci", "kubernetes", "profiles"):
        assert (EXAMPLES / folder / "README.md").is_file(), folder


def test_every_kvgate_command_line_parses() -> None:
    commands = example_commands()
    where = {f.split("/")[1] for f, _ in commands}
    assert {"github-actions", "gitlab-ci", "kubernetes", "profiles"} <= where, where
    for path, argv in commands:
        try:
            ctx = parse(argv)
        except Exception as exc:  # click's UsageError / BadParameter / NoSuchOption
            pytest.fail(f"{path}: `kvgate {' '.join(argv)}` does not parse: {exc}")
        if ctx is not None and ctx.params.get("profile"):
            _gates_from_profile(profile_file(ctx.params["profile"]))
    checks = [argv for _, argv in commands if argv[:1] == ["check"]]
    assert len(checks) >= 5 and all("--token-env" in a for a in checks), checks


def test_the_github_example_uses_the_action() -> None:
    workflow = _docs(EXAMPLES / "github-actions" / "kvgate-canary.yml")[0]
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    (gate,) = [s for s in steps if _uses_kvgate_action(s)]
    assert set(gate["with"]) <= set(yaml.safe_load((ROOT / "action.yml").read_text())["inputs"]), gate["with"]
    assert "SGLANG_API_KEY" in gate.get("env", {}) and gate["with"]["token-env"] == "SGLANG_API_KEY"


def test_the_parser_catches_a_bad_flag() -> None:
    (argv,) = list(shell_commands("echo go && kvgate check --prefill-url http://p:1 --no-such-flag \\\n  -q > out"))
    assert argv == ["check", "--prefill-url", "http://p:1", "--no-such-flag", "-q"]
    with pytest.raises(Exception, match="no-such-flag"):
        parse(argv)
    with pytest.raises(typer.BadParameter):
        parse(["check", "--tenants", "many"])


def _gates_from_profile(path: Path) -> None:
    from kvgate.check import default_gates
    from kvgate.commands.check import _options

    options = _options(["http://p:1"], ["http://d:1"], "http://r:1", str(path), None, None, None, False)
    # pool-context, defenses, fleet, probes: every section validated
    assert [g.name for g in default_gates(options)] == ["pool-context", "defenses", "fleet", "probes"]


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.yaml")), ids=lambda p: p.name)
def test_profiles_load_and_build_their_gates(path: Path) -> None:
    from kvgate.profiles import load

    prof = load(str(path))
    assert prof.name == path.stem and prof.context_length and prof.strict is True
    _gates_from_profile(path)


def _k8s_objects() -> list[tuple[str, dict[str, Any]]]:
    return [(str(p.relative_to(ROOT)), d) for p in sorted((EXAMPLES / "kubernetes").glob("*.yaml")) for d in _docs(p)]


def test_kubernetes_manifests_are_structurally_sound() -> None:
    objs = _k8s_objects()
    kinds = {d["kind"] for _, d in objs}
    assert {"Job", "AnalysisTemplate", "Canary", "PersistentVolumeClaim"} <= kinds, kinds
    for path, d in objs:
        assert d.get("apiVersion") and d.get("metadata", {}).get("name"), path
        if d["kind"] == "AnalysisTemplate":
            declared = {a["name"] for a in d["spec"]["args"]}
            used = set(re.findall(r"\{\{args\.([\w-]+)\}\}", yaml.safe_dump(d)))
            assert used <= declared, (path, used - declared)
            (metric,) = d["spec"]["metrics"]
            assert metric["count"] == 1 and metric["failureLimit"] == 0  # promote only on exit 0
            assert metric["provider"]["job"]["spec"]["backoffLimit"] == 0
        if d["kind"] == "Canary":
            hooks = d["spec"]["analysis"]["webhooks"]
            assert any(h["type"] == "pre-rollout" and "kvgate check" in h["metadata"]["cmd"] for h in hooks)
        if d["kind"] == "Job":
            (c,) = d["spec"]["template"]["spec"]["containers"]
            env = {e["name"]: e for e in c["env"]}
            assert "secretKeyRef" in env["SGLANG_API_KEY"]["valueFrom"]  # the token comes from a Secret
            assert any(m["mountPath"] == "/reports" for m in c["volumeMounts"])


def test_kubernetes_manifests_validate_against_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the test extra) ships the schema")
    checked = 0
    for _path, d in _k8s_objects():
        if d["apiVersion"] in ("v1", "batch/v1", "apps/v1"):
            kv.validate(d, K8S_VERSION, strict=True)
            checked += 1
        elif d["kind"] == "AnalysisTemplate":
            for m in d["spec"]["metrics"]:
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "analysis"},
                    "spec": m["provider"]["job"]["spec"],
                }
                kv.validate(job, K8S_VERSION, strict=True)
                checked += 1
    assert checked >= 3
    with pytest.raises(kv.ValidationError):  # the validator does reject a mistyped field
        bad = next(d for _, d in _k8s_objects() if d["kind"] == "Job")
        kv.validate({**bad, "spec": {**bad["spec"], "backofLimit": 1}}, K8S_VERSION, strict=True)


def test_third_party_actions_are_pinned_by_commit_sha() -> None:
    """A tag can be moved under a workflow: every action not kvgate's own is a full commit SHA, its
    release in a comment on the same line."""
    uses = re.compile(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$")
    seen = 0
    for path in [*EXAMPLES.rglob("*.yml"), *EXAMPLES.rglob("*.yaml"), ROOT / "action.yml"]:
        for line in path.read_text().splitlines():
            m = uses.match(line)
            if not m or m.group(1).startswith(("./", "your-org/kvgate@")):
                continue
            seen += 1
            ref, rest = m.group(1), m.group(2)
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{path.name}: {ref} is not pinned by SHA"
            assert re.search(r"#\s*v\d+(\.\d+)*", rest), f"{path.name}: {ref} has no '# vX.Y.Z' comment"
    assert seen >= 4
