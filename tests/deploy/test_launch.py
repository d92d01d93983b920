"""Launching PD deployments: SGLang's command lines, and the whole path run with the simulator engine."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from kvgate.cli import app
from kvgate.deploy.launch import PDDeployment, PDLaunchPlan, dp_env, plan_slots, worker_argv
from kvgate.errors import UsageError
from kvgate.exitcodes import ExitStatus
from kvgate.upstream.releases import CPU_THREADS_BIND, FORCE_QUERY_PREFILL_DP_RANK

runner = CliRunner()


def _gate_a_sim_pair(release: str, prefill_pool: int, *extra: str) -> Result:
    """`kvgate up --engine sim --gate -q`: a simulated pair of `release` at an 8,192-token context, its
    decode pool 16,384 tokens, gated once; `extra` adds flags."""
    args = ["up", "--engine", "sim", "--release", release, "--context-length", "8192"]
    return runner.invoke(
        app, [*args, "--prefill-pool", str(prefill_pool), "--decode-pool", "16384", "--gate", "-q", *extra]
    )


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_sglang_argv_uses_sglang_flags_and_places_gpus() -> None:
    plan = PDLaunchPlan(
        model_path="zai-org/GLM-5.3",
        prefill=2,
        decode=1,
        tp_size=4,
        context_length=1_048_576,
        prefill_max_total_tokens=2_040_000,
        transfer_backend="nixl",
        ib_device="mlx5_0",
        python="/opt/py/bin/python",
    )
    slots = plan_slots(plan)
    argvs = [worker_argv(plan, s) for s in slots]
    assert [a[:3] for a in argvs] == [["/opt/py/bin/python", "-m", "sglang.launch_server"]] * 3
    assert [_flag(a, "--disaggregation-mode") for a in argvs] == ["prefill", "prefill", "decode"]
    assert [_flag(a, "--base-gpu-id") for a in argvs] == ["0", "4", "8"]
    assert len({_flag(a, "--nccl-port") for a in argvs}) == 3
    assert len({_flag(a, "--port") for a in argvs}) == 3
    assert _flag(argvs[0], "--max-total-tokens") == "2040000" and "--max-total-tokens" not in argvs[2]
    assert all(_flag(a, "--disaggregation-transfer-backend") == "nixl" for a in argvs)
    assert all(_flag(a, "--context-length") == "1048576" for a in argvs)
    # The simulator engine gets the very same SGLang flags; only the program differs.
    sim_plan = dataclasses.replace(plan, engine="sim", emulate="0.5.20")
    sim = worker_argv(sim_plan, slots[2])
    assert sim[1:4] == ["-m", "kvgate.sim", "worker"]
    tail = argvs[2][argvs[2].index("--disaggregation-mode") :]
    assert sim[sim.index("--disaggregation-mode") :] == tail


def test_dp_ranks_get_their_flag_their_own_nccl_ports_and_what_smg_routing_needs() -> None:
    plan = PDLaunchPlan(model_path="m", prefill=1, decode=1, tp_size=2, dp_size=2)
    argvs = [worker_argv(plan, s) for s in plan_slots(plan)]
    assert all(_flag(a, "--dp-size") == "2" for a in argvs)
    # An explicit --nccl-port goes to every DP rank, whose process groups then collide on it.
    assert all("--nccl-port" not in a for a in argvs)
    assert [_flag(a, "--base-gpu-id") for a in argvs] == ["0", "4"]
    assert dp_env(plan) == {FORCE_QUERY_PREFILL_DP_RANK: "1"}
    assert plan.resolved().env == {FORCE_QUERY_PREFILL_DP_RANK: "1"}
    cpu = dataclasses.replace(plan, device="cpu", tp_size=1)
    bind = dp_env(cpu)[CPU_THREADS_BIND].split("|")
    assert len(bind) == 2 and all(b.isdigit() for b in bind)
    # The plan's own environment wins; one rank needs nothing.
    own = dataclasses.replace(plan, env={FORCE_QUERY_PREFILL_DP_RANK: "0"})
    assert own.resolved().env[FORCE_QUERY_PREFILL_DP_RANK] == "0"
    one = PDLaunchPlan(model_path="m")
    assert dp_env(one) == {} and "--dp-size" not in worker_argv(one, plan_slots(one)[0])


@pytest.mark.parametrize(
    "kw",
    [
        {"engine": "vllm"},
        {"transfer_backend": "fake"},
        {"engine": "sim"},
        {"decode": 0},
        {"dp_size": 0},
        {"engine": "sim", "emulate": "0.5.22", "dp_size": 2},
    ],
)
def test_invalid_plans_are_usage_errors(kw: dict) -> None:
    with pytest.raises(UsageError):
        PDLaunchPlan(model_path="m", **kw).validate()


@pytest.mark.slow
def test_up_gate_with_the_simulator_engine(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = _gate_a_sim_pair("0.5.22", 16384, "-f", "json", "-o", str(out))
    doc = json.loads(out.read_text())
    # Strict by default: a pass needs every check observed; an unobserved probe is exit 3, said so.
    unobserved = [f for f in doc["findings"] if f["outcome"] == "inconclusive"]
    assert not [f for f in doc["findings"] if f["outcome"] in ("failed", "error")], res.output
    assert res.exit_code == (ExitStatus.INCONCLUSIVE if unobserved else ExitStatus.PASSED), res.output
    assert {n["role"] for n in doc["target"]["nodes"]} == {"prefill", "decode"}
    deferred = [f for f in doc["findings"] if f["check"] == "deferred-release"]
    assert deferred and all(f["outcome"] == "passed" for f in deferred), deferred
    # no --model-path: the simulator serves its own; the temp log folder it leaves is said, with its size
    (logs,) = [n for n in doc["notes"] if n.startswith("worker logs: ")]
    folder = Path(logs.split()[2])
    assert folder.is_dir() and folder.name.startswith("kvgate-pd-") and f"rm -rf {folder}" in logs
    shutil.rmtree(folder)


@pytest.mark.slow
def test_up_gate_fails_a_leaky_release(tmp_path: Path) -> None:
    res = _gate_a_sim_pair("0.5.19", 4096, "--model-path", "toy")
    assert res.exit_code == ExitStatus.GATE_FAILED, res.output


def test_a_cpu_plan_can_run_another_copy_of_the_release(tmp_path: Path) -> None:
    """`site_packages` (e.g. a backported copy) replaces the cached install on PYTHONPATH and in code_sources."""
    from kvgate.cpuserver.env import STUB_DIR, ServerEnv
    from kvgate.deploy.launch import PDDeployment

    site = tmp_path / "site"
    cpu = {"engine": "sglang", "device": "cpu", "release": "0.5.20"}
    with pytest.raises(UsageError, match="no sglang/__init__.py"):
        PDLaunchPlan(model_path="m", site_packages=str(site), **cpu).validate()
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    with pytest.raises(UsageError, match="give release"):
        PDLaunchPlan(model_path="m", site_packages=str(site)).validate()
    plan = PDLaunchPlan(model_path="m", site_packages=str(site), **cpu)
    plan.validate()
    assert PDDeployment(plan).code_sources() == {"*": {"site_packages": str(site)}}
    env = ServerEnv("0.5.20", "/py", (str(STUB_DIR), "/cache/sglang-0.5.20")).running(site)
    assert env.env({})["PYTHONPATH"].split(":") == [str(STUB_DIR), str(site)]


@pytest.mark.slow
def test_restart_worker_changes_one_pool_on_the_same_url(tmp_path: Path) -> None:
    """A restart with another pool (issue 22's capacity change): same URL, the new pool in server_info,
    the router still lists the worker and serves through it, the other worker untouched."""
    plan = PDLaunchPlan(
        model_path="toy",
        engine="sim",
        emulate="0.5.22",
        context_length=4096,
        prefill_max_total_tokens=8192,
        decode_max_total_tokens=8192,
        ready_deadline_s=60.0,
    )
    with PDDeployment(plan, log_dir=tmp_path) as dep:
        assert dep.supervisor is not None and dep.router_url is not None
        prefill, decode = dep.prefill_urls[0], dep.decode_urls[0]
        pids = {p.name: p.pid for p in dep.supervisor.processes}
        assert httpx.get(prefill + "/server_info").json()["max_total_num_tokens"] == 8192

        dep.restart_worker("prefill", 0, pool=2048)

        assert dep.prefill_urls == [prefill] and dep.decode_urls == [decode]
        assert httpx.get(prefill + "/server_info").json()["max_total_num_tokens"] == 2048
        assert httpx.get(decode + "/server_info").json()["max_total_num_tokens"] == 8192
        live = {p.name: p.pid for p in dep.supervisor.processes if p.alive()}
        assert live["prefill0"] != pids["prefill0"] and live["decode0"] == pids["decode0"]
        assert not [p for p in dep.supervisor.processes if p.stopped and p.alive()]
        listed = {w["url"] for w in httpx.get(dep.router_url + "/workers").json()["workers"]}
        assert prefill in listed
        body = {"input_ids": [5] * 16, "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(dep.router_url + "/generate", json=body, timeout=30).status_code == 200
        with pytest.raises(UsageError, match="no started decode worker 1"):
            dep.restart_worker("decode", 1, pool=2048)
