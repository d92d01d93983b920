"""examples/: every file parses, every `kvgate ...` command line in them parses with kvgate's own CLI,
every profile loads and builds its gates, and the Kubernetes manifests validate against the Kubernetes
schema (shipped offline by kubernetes-validate) or, for CRDs, structurally."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import yaml
from typer.testing import CliRunner

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
    from kvgate.commands.check import _options
    from kvgate.pipeline.check import default_gates

    options = _options(["http://p:1"], ["http://d:1"], "http://r:1", str(path), None, None, None, False)
    # pool-context, defenses, fleet, probes: every section validated
    assert [g.name for g in default_gates(options)] == ["pool-context", "defenses", "fleet", "probes"]


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.yaml")), ids=lambda p: p.name)
def test_profiles_load_and_build_their_gates(path: Path) -> None:
    from kvgate.gates.profiles import load

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


# --- each example's command lines, end to end against a simulated fleet (issue 42) ----------------------
# The fleet as the examples assume it: the profile's 1M context, the workers started with
# SGLANG_EXPOSE_OWN_ENV_VARS=1 (their deferred-release setting readable), the real router in front. Each
# node's code is read the way the examples read it, through their per-node `--python` template: a
# `kubectl` TEST STAND-IN on PATH (tests/assets/standin/kubectl) runs the command after `--` here, with
# the real sglang wheel of the emulated release as the pod's sglang.
STANDIN = ROOT / "tests" / "assets" / "standin"
FLEETS = {
    "healthy-0.5.22": ("0.5.22", 2_040_000, 0),
    "incident-0.5.19": ("0.5.19", 681_280, 1),
}


def pipeline_checks() -> list[tuple[str, list[str]]]:
    """(file, argv) of every `kvgate check` and `kvgate watch` an example runs."""
    return [(f, a) for f, a in example_commands() if a[:1] in (["check"], ["watch"])]


def on_fleet(argv: list[str], dep: Any, out_dir: Path) -> list[str]:
    """The example's command line aimed at the simulated fleet: its worker and router URLs swapped for the
    fleet's, its profile the repository's file, its report files in `out_dir`; every other word as written
    (the `--python` template included)."""
    urls = {"--prefill-url": iter(dep.prefill_urls), "--decode-url": iter(dep.decode_urls)}
    out: list[str] = []
    words = iter(argv)
    for a in words:
        if a in urls:
            out += [a, next(urls[a])]
            next(words)
        elif a == "--router-url":
            out += [a, dep.router_url]
            next(words)
        elif a == "--profile":
            out += [a, str(profile_file(next(words)))]
        elif a in ("--output", "-o"):
            out += [a, str(out_dir / Path(next(words)).name)]
        elif a == "--listen":
            next(words)  # WatchProcess listens on a free local port
        else:
            out.append(a)
    return out


@pytest.fixture(scope="module", params=sorted(FLEETS))
def fleet(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str, int]]:
    from kvgate.sim.deploy import SimDeployment

    release, prefill_pool, expect = FLEETS[request.param]
    dep = SimDeployment(
        emulate=release,
        context_length=1_048_576,
        prefill_pool=prefill_pool,
        decode_pool=2_097_152,
        page_size=16,
        expose_env_vars=True,
    )
    dep.start()
    try:
        yield dep, release, expect
    finally:
        dep.stop()
        if dep.log_dir is not None:
            shutil.rmtree(dep.log_dir, ignore_errors=True)


@pytest.fixture
def pods(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fleet: tuple[Any, str, int]) -> Path:
    """The kubectl stand-in on PATH, the release's real sglang as each pod's, the token; returns its log."""
    from tests.catalogue.helpers import wheel

    log = tmp_path / "kubectl.log"
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("KVGATE_TEST_SGLANG_SITE", str(wheel(fleet[1])))
    monkeypatch.setenv("KVGATE_TEST_KUBECTL_LOG", str(log))
    monkeypatch.setenv("SGLANG_API_KEY", "kvgate-example-bearer-0123456789")
    return log


@pytest.mark.slow
@pytest.mark.wheels
@pytest.mark.parametrize(("where", "argv"), [pytest.param(f, a, id=f) for f, a in pipeline_checks() if a[0] == "check"])
def test_each_example_passes_a_healthy_fleet_and_blocks_the_incident(
    where: str, argv: list[str], fleet: tuple[Any, str, int], pods: Path, tmp_path: Path
) -> None:
    dep, release, expect = fleet
    cmd = on_fleet(argv, dep, tmp_path)
    res = CliRunner().invoke(app, [*cmd, "-q", "-f", "json", "-o", str(tmp_path / "gate.json")])
    doc = json.loads((tmp_path / "gate.json").read_text())
    blocking = [(f["gate"], f["check"], f["outcome"]) for f in doc["findings"] if f["outcome"] != "passed"]
    assert res.exit_code == expect, f"{where} on {release}: exit {res.exit_code}, {blocking}"
    # each node's code was read in its own "pod", as the template names it
    scanned = pods.read_text().splitlines()
    assert len(scanned) == 2 and all(s.startswith("exec -i -n ") for s in scanned), scanned
    release_findings = [f for f in doc["findings"] if f["gate"] == "defenses" and f["check"] == "release"]
    assert release_findings and all("code not read" not in f["summary"] for f in release_findings)


@pytest.mark.slow
@pytest.mark.wheels
def test_the_watch_deployment_serves_a_passing_verdict_on_a_healthy_fleet(
    fleet: tuple[Any, str, int], pods: Path, tmp_path: Path
) -> None:
    from tests.watch.helpers import WatchProcess

    dep, release, expect = fleet
    where = "examples/kubernetes/watch/watch-deployment.yaml"
    (argv,) = [a for f, a in pipeline_checks() if f == where]
    watch = WatchProcess(on_fleet(argv, dep, tmp_path)[1:], tmp_path / "watch.log")
    try:
        watch.wait(watch.verdict_settled, 600, f"{where}: a first full gate")
        res = watch.get("/verdict")
        assert res is not None
        verdict = res.json()
        assert verdict["exit_status"] == expect, (where, release, verdict["reason"])
        assert res.status_code == (200 if expect == 0 else 503) and verdict["passed"] is (expect == 0)
    finally:
        assert watch.terminate() == 0


@pytest.mark.slow
def test_the_watch_readme_try_it_locally_ends_at_a_passing_verdict(tmp_path: Path) -> None:
    """examples/kubernetes/watch/README.md's lines as written: `sim up`, then `watch` on its router, until
    /verdict answers 200 (it ended at 503, exit 3, when `sim up` lacked what the watch needs)."""
    from tests.sim.test_cli_up import _start
    from tests.watch.helpers import WatchProcess

    page = "examples/kubernetes/watch/README.md"
    sim_up, watch_argv = [
        a for f, a in example_commands() if f == page and (a[:2] == ["sim", "up"] or a[:1] == ["watch"])
    ]
    assert sim_up[:2] == ["sim", "up"] and watch_argv[0] == "watch"
    proc, urls = _start(tmp_path, *sim_up[2:])
    try:
        args = [urls["router"] if a == "$ROUTER" else a for a in watch_argv[1:]]
        listen = args.index("--listen")
        watch = WatchProcess(args[:listen] + args[listen + 2 :], tmp_path / "watch.log")
        try:
            watch.wait(watch.verdict_settled, 600, "the first full gate")
            res = watch.get("/verdict")
            assert res is not None and res.status_code == 200, res.text if res is not None else None
            assert res.json()["passed"] is True
        finally:
            assert watch.terminate() == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


# The first major of each action whose action.yml declares `runs.using: node24` (GitHub retires node20):
# their release notes (checkout v5.0.0, setup-python v6.0.0; upload-artifact v6.0.0: v5 still ran on
# node20; codeql-action v4).
NODE24_FROM = {
    "actions/checkout": 5,
    "actions/setup-python": 6,
    "actions/upload-artifact": 6,
    "github/codeql-action": 4,
}


def test_pinned_actions_are_node24_releases() -> None:
    uses = re.compile(r"^\s*(?:-\s+)?uses:\s*([\w.-]+/[\w.-]+)[\w./-]*@[0-9a-f]{40}\s+#\s*v(\d+)")
    seen = set()
    for path in [*EXAMPLES.rglob("*.yml"), *EXAMPLES.rglob("*.yaml"), ROOT / "action.yml"]:
        for line in path.read_text().splitlines():
            m = uses.match(line)
            if m:
                action, major = m.group(1), int(m.group(2))
                assert action in NODE24_FROM, f"{path.name}: {action}: which release runs on node24 is not known here"
                assert major >= NODE24_FROM[action], f"{path.name}: {action} v{major} runs on node20"
                seen.add(action)
    assert seen == set(NODE24_FROM), seen
