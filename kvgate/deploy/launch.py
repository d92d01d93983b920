"""Launching a real SGLang PD deployment: N prefill and M decode workers plus the real router.

For GPU machines: workers are `python -m sglang.launch_server` with SGLang's own PD flags
(sglang-surface.md section 3, the upstream PD docs and sglang's disaggregation test fixture), the
router is `smg launch --pd-disaggregation`. The same plan can run the embedded simulator instead
(`engine="sim"`), whose workers take SGLang's flag names (placement flags accepted and ignored), so
the same command lines are exercised where there is no GPU. With `device="cpu"` and a `release`, the
real server runs on this CPU (kvgate.cpuserver: the release's cached environment, kvgate's tiny model,
the flags cpu-sglang.md measured). The start sequence is `kvgate.deploy.pdstart`'s, the simulator's too;
processes are owned by `kvgate.deploy.supervisor`: one process group each, per-process logs, a readiness
deadline, teardown of every group.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvgate.deploy.pdstart import HEALTH_READ_TIMEOUT_S, DistinctPorts, PDLayout, WorkerProcess, start_pd
from kvgate.deploy.supervisor import Supervisor, http_ok
from kvgate.errors import UsageError
from kvgate.upstream.releases import CPU_THREADS_BIND, FORCE_QUERY_PREFILL_DP_RANK

ENGINES = ("sglang", "sim")
DEVICES = ("gpu", "cpu")
BACKENDS = ("mooncake", "nixl", "ascend", "mori", "mooncake_tcp")  # `fake` is decode-only in SGLang


@dataclass(frozen=True)
class PDLaunchPlan:
    """What to start. GPU placement: prefill i, then decode j, each on `tp_size` x `dp_size` consecutive GPUs."""

    model_path: str | None
    prefill: int = 1
    decode: int = 1
    tp_size: int = 1
    dp_size: int = 1  # DP ranks per worker (SGLang --dp-size); >1 puts the router in DP-aware routing
    context_length: int | None = None
    prefill_max_total_tokens: int | None = None
    decode_max_total_tokens: int | None = None
    mem_fraction_static: float | None = None
    page_size: int | None = None
    transfer_backend: str = "mooncake"
    ib_device: str | None = None
    host: str = "127.0.0.1"
    python: str = sys.executable
    engine: str = "sglang"
    device: str = "gpu"
    release: str | None = None  # device cpu: the SGLang release whose cached CPU environment runs
    # device cpu: run this copy of the release's sglang (a site-packages layout holding `sglang/`, e.g. one
    # `kvgate backport --site-packages` patched) instead of the cached install; code_sources() names it.
    site_packages: str | None = None
    skip_tokenizer_init: bool = False
    emulate: str | None = None
    extra_worker_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    ready_deadline_s: float = 1800.0

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise UsageError(f"--device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r}: choose one of {', '.join(ENGINES)}")
        if self.transfer_backend not in BACKENDS:
            raise UsageError(
                f"--transfer-backend {self.transfer_backend!r}: choose one of {', '.join(BACKENDS)} "
                "(SGLang's prefill refuses 'fake')"
            )
        if self.prefill < 1 or self.decode < 1 or self.tp_size < 1 or self.dp_size < 1:
            raise UsageError("need at least one prefill and one decode worker, and --tp-size, --dp-size >= 1")
        if self.engine == "sim" and self.dp_size > 1:
            raise UsageError("--dp-size needs --engine sglang (the simulator's workers serve one rank)")
        if self.engine == "sim" and self.emulate is None:
            raise UsageError("--engine sim needs --release (the SGLang release to reproduce)")
        if self.release is not None and not (self.engine == "sglang" and self.device == "cpu"):
            raise UsageError(
                "--release with --engine sglang picks kvgate's CPU environment of a release: only with --device cpu"
            )
        if self.site_packages is not None:
            if self.release is None:
                raise UsageError("site_packages replaces the sglang of a release's CPU environment: give release")
            if not (Path(self.site_packages) / "sglang" / "__init__.py").is_file():
                raise UsageError(f"{self.site_packages}: no sglang/__init__.py there (not a site-packages layout)")

    def resolved(self) -> PDLaunchPlan:
        """The plan with what `release` implies filled in: the CPU environment's interpreter and process
        environment, and kvgate's tiny model when no model was given (built on first use, cached); with DP
        ranks, what they need in the environment (dp_env; the plan's own env wins)."""
        if self.release is None:
            return replace(self, env={**dp_env(self), **self.env}) if self.dp_size > 1 else self
        from kvgate.cpuserver.env import DISABLED_ARCHS_ENV, server_env, unused_model_modules
        from kvgate.cpuserver.model import tiny_model

        env = server_env(self.release)
        if self.site_packages is not None:
            env = env.running(Path(self.site_packages))
        model = self.model_path or str(tiny_model())
        process_env = env.env()
        if DISABLED_ARCHS_ENV not in process_env:  # an operator's own list wins
            unused = unused_model_modules(env.sglang_dir, Path(model))
            if unused:
                process_env[DISABLED_ARCHS_ENV] = ",".join(unused)
        return replace(self, python=env.python, model_path=model, env={**process_env, **dp_env(self), **self.env})


def dp_env(plan: PDLaunchPlan) -> dict[str, str]:
    """What workers with DP ranks need in their environment (none for one rank): the prefill rank query
    (upstream.FORCE_QUERY_PREFILL_DP_RANK: smg --dp-aware picks ranks itself) and, on CPU, each rank's cores."""
    if plan.dp_size <= 1:
        return {}
    out = {FORCE_QUERY_PREFILL_DP_RANK: "1"}
    if plan.device == "cpu":
        cores = sorted(os.sched_getaffinity(0))
        ranks = plan.dp_size * plan.tp_size
        # One core per rank where there are enough; otherwise ranks share them in turn.
        out[CPU_THREADS_BIND] = "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    return out


@dataclass(frozen=True)
class WorkerSlot:
    """Ports and GPUs of one worker."""

    role: str
    index: int
    port: int
    bootstrap_port: int
    nccl_port: int
    base_gpu_id: int

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"


def plan_slots(plan: PDLaunchPlan, ports: Callable[[], int] | None = None) -> list[WorkerSlot]:
    """Free ports for every worker (from `ports`, distinct by default); GPUs assigned in order, tp_size x
    dp_size each."""
    ports = ports or DistinctPorts(plan.host)
    slots: list[WorkerSlot] = []
    gpu = 0
    prefill_bootstrap = ports()
    for role, count in (("prefill", plan.prefill), ("decode", plan.decode)):
        for i in range(count):
            # Each prefill serves its own bootstrap; decodes name the first (the router passes the real one).
            bport = ports() if role == "prefill" and i > 0 else prefill_bootstrap
            slots.append(WorkerSlot(role, i, ports(), bport, ports(), gpu))
            gpu += plan.tp_size * plan.dp_size
    return slots


def plan_layout(plan: PDLaunchPlan, ports: Callable[[], int] | None = None) -> PDLayout:
    """The processes of `plan` (one per worker) and the workers the router fronts."""
    processes: list[WorkerProcess] = []
    prefill: list[tuple[str, int]] = []
    decode: list[str] = []
    for slot in plan_slots(plan, ports):
        url = f"http://{plan.host}:{slot.port}"
        processes.append(WorkerProcess(slot.name, tuple(worker_argv(plan, slot)), (url,)))
        if slot.role == "prefill":
            prefill.append((url, slot.bootstrap_port))
        else:
            decode.append(url)
    return PDLayout(tuple(processes), tuple(prefill), tuple(decode))


def worker_argv(plan: PDLaunchPlan, slot: WorkerSlot) -> list[str]:
    """The command line of one worker, SGLang's flags throughout."""
    if plan.engine == "sglang":
        argv = [plan.python, "-m", "sglang.launch_server", "--model-path", str(plan.model_path)]
    else:
        argv = [
            plan.python,
            "-m",
            "kvgate.sim",
            "worker",
            "--model-path",
            str(plan.model_path or "toy"),
            "--emulate",
            str(plan.emulate),
        ]
    argv += [
        "--disaggregation-mode",
        slot.role,
        "--host",
        plan.host,
        "--port",
        str(slot.port),
        "--disaggregation-bootstrap-port",
        str(slot.bootstrap_port),
        "--disaggregation-transfer-backend",
        plan.transfer_backend,
        "--tp-size",
        str(plan.tp_size),
        # SGLang's request counters on /metrics: how probes.pd.* shows which workers served the probes.
        "--enable-metrics",
    ]
    # The simulator accepts (and ignores) the placement flags, so both engines get one command line.
    if plan.device == "gpu":
        argv += ["--base-gpu-id", str(slot.base_gpu_id)]
    if plan.dp_size > 1:
        # No --nccl-port: SGLang hands an explicit one to every DP rank, and the ranks' process groups
        # then collide on it (EADDRINUSE, 0.5.22); without it each rank draws its own.
        argv += ["--dp-size", str(plan.dp_size)]
    else:
        argv += ["--nccl-port", str(slot.nccl_port)]
    mem_fraction = plan.mem_fraction_static
    if plan.device == "cpu" and plan.engine == "sglang":
        from kvgate.cpuserver.env import CPU_MEM_FRACTION_STATIC, cpu_worker_flags

        argv += cpu_worker_flags(slot.role)
        mem_fraction = CPU_MEM_FRACTION_STATIC if mem_fraction is None else mem_fraction
    if plan.skip_tokenizer_init:
        argv += ["--skip-tokenizer-init"]
    if mem_fraction is not None:
        argv += ["--mem-fraction-static", str(mem_fraction)]
    if plan.ib_device:
        argv += ["--disaggregation-ib-device", plan.ib_device]
    if plan.context_length is not None:
        argv += ["--context-length", str(plan.context_length)]
    pool = plan.prefill_max_total_tokens if slot.role == "prefill" else plan.decode_max_total_tokens
    if pool is not None:
        argv += ["--max-total-tokens", str(pool)]
    if plan.page_size is not None:
        argv += ["--page-size", str(plan.page_size)]
    return argv + list(plan.extra_worker_args)


@dataclass
class PDDeployment:
    """A started deployment: its URLs, its supervisor. `stop()` tears down every process group."""

    plan: PDLaunchPlan
    log_dir: Path | None = None
    router_url: str | None = field(default=None, init=False)
    prefill_urls: list[str] = field(default_factory=list, init=False)
    decode_urls: list[str] = field(default_factory=list, init=False)
    supervisor: Supervisor | None = field(default=None, init=False)

    def start(self) -> PDDeployment:
        """Start the workers, then the router, and wait until a request is served (`kvgate.deploy.pdstart`)."""
        self.plan.validate()
        self.plan = self.plan.resolved()
        if not self.plan.model_path and self.plan.engine != "sim":  # the simulator serves its own toy model
            raise UsageError("--model-path is required (only --device cpu --release R has a default model)")
        plan = self.plan
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="kvgate-pd-"))
        self.log_dir = log_dir
        started = start_pd(
            lambda ports: plan_layout(plan, ports),
            # die_with_parent: workers holding GPUs must not outlive a kvgate that was SIGKILLed.
            lambda: Supervisor(log_dir=log_dir, grace_s=10.0, die_with_parent=True),
            host=plan.host,
            env=dict(plan.env),
            ready_deadline_s=plan.ready_deadline_s,
            poll_s=0.5,
            serve_check=True,
            attempts=2,  # a port taken between pick and bind: start again on fresh ports
            router_args=["--dp-aware"] if plan.dp_size > 1 else [],
        )
        self.supervisor = started.supervisor
        self.router_url = started.router_url
        self.prefill_urls = [url for url, _ in started.layout.prefill]
        self.decode_urls = list(started.layout.decode)
        return self

    def restart_worker(self, role: str, index: int, *, pool: int, deadline_s: float | None = None) -> None:
        """Stop one worker and start it again on the same ports with `--max-total-tokens pool`: a capacity
        change as an operator's restart makes it. The router is left alone (it keeps its worker list; what
        it says while the worker is down is its own). Returns once the worker answers /health; a worker
        that does not within `deadline_s` (default: the plan's ready deadline) is a SupervisorError."""
        urls = {"prefill": self.prefill_urls, "decode": self.decode_urls}.get(role)
        if self.supervisor is None or urls is None or not 0 <= index < len(urls):
            raise UsageError(f"restart_worker: no started {role} worker {index}")
        name = f"{role}{index}"
        old = next(p for p in reversed(self.supervisor.processes) if p.name == name and not p.stopped)
        self.supervisor.stop_processes([old])
        argv = list(old.argv)
        if "--max-total-tokens" in argv:
            argv[argv.index("--max-total-tokens") + 1] = str(pool)
        else:
            argv += ["--max-total-tokens", str(pool)]
        proc = self.supervisor.start(name, argv, env=dict(self.plan.env))
        self.supervisor.wait_ready(
            [proc],
            deadline_s=self.plan.ready_deadline_s if deadline_s is None else deadline_s,
            poll_s=0.5,
            check=lambda _p: http_ok(urls[index] + "/health", timeout=HEALTH_READ_TIMEOUT_S),
        )

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def code_sources(self) -> dict[str, dict[str, str]]:
        """Where the code the workers run lives, when kvgate installed it (device cpu, a release): the
        defenses gate then reads that code instead of trusting the version string."""
        if self.plan.release is None:
            return {}
        if self.plan.site_packages is not None:
            return {"*": {"site_packages": self.plan.site_packages}}
        from kvgate.backport.cpuenv import overlay_dir

        return {"*": {"site_packages": str(overlay_dir(self.plan.release))}}

    def info(self) -> dict[str, object]:
        return {
            "router": self.router_url,
            "prefill": self.prefill_urls,
            "decode": self.decode_urls,
            "logs": str(self.log_dir),
        }

    def __enter__(self) -> PDDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
