"""Launching a real SGLang PD deployment: N prefill and M decode workers plus the real router.

For GPU machines: workers are `python -m sglang.launch_server` with SGLang's own PD flags
(sglang-surface.md section 3, the upstream PD docs and sglang's disaggregation test fixture), the
router is `smg launch --pd-disaggregation`. The same plan can run the embedded simulator instead
(`engine="sim"`), whose workers take SGLang's flag names (placement flags accepted and ignored), so
the same command lines are exercised where there is no GPU. With `device="cpu"` and a `release`, the
real server runs on this CPU (kvgate.cpuserver: the release's cached environment, kvgate's tiny model,
the flags cpu-sglang.md measured). Processes are owned by `kvgate.supervisor`: one process group each,
per-process logs, a readiness deadline, teardown of every group.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvgate.errors import UsageError
from kvgate.supervisor import ManagedProcess, Supervisor, SupervisorError, free_port
from kvgate.upstream import HEALTH_CHECK_TIMEOUT_S

ENGINES = ("sglang", "sim")
DEVICES = ("gpu", "cpu")
BACKENDS = ("mooncake", "nixl", "ascend", "mori", "mooncake_tcp")  # `fake` is decode-only in SGLang


@dataclass(frozen=True)
class PDLaunchPlan:
    """What to start. GPU placement: prefill i, then decode j, each on `tp_size` consecutive GPUs."""

    model_path: str | None
    prefill: int = 1
    decode: int = 1
    tp_size: int = 1
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
        if self.prefill < 1 or self.decode < 1 or self.tp_size < 1:
            raise UsageError("need at least one prefill and one decode worker, and --tp-size >= 1")
        if self.engine == "sim" and self.emulate is None:
            raise UsageError("--engine sim needs --emulate (the SGLang release to reproduce)")
        if self.release is not None and not (self.engine == "sglang" and self.device == "cpu"):
            raise UsageError(
                "--release picks kvgate's CPU environment of a release: only with --engine sglang --device cpu"
            )

    def resolved(self) -> PDLaunchPlan:
        """The plan with what `release` implies filled in: the CPU environment's interpreter and process
        environment, and kvgate's tiny model when no model was given (built on first use, cached)."""
        if self.release is None:
            return self
        from kvgate.cpuserver.env import server_env
        from kvgate.cpuserver.model import tiny_model

        env = server_env(self.release)
        model = self.model_path or str(tiny_model())
        return replace(self, python=env.python, model_path=model, env={**env.env(), **self.env})


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


def plan_slots(plan: PDLaunchPlan) -> list[WorkerSlot]:
    """Free ports for every worker; GPUs assigned in order, tp_size each."""
    slots: list[WorkerSlot] = []
    gpu = 0
    prefill_bootstrap = free_port(plan.host)
    for role, count in (("prefill", plan.prefill), ("decode", plan.decode)):
        for i in range(count):
            # Each prefill serves its own bootstrap; decodes name the first (the router passes the real one).
            bport = free_port(plan.host) if role == "prefill" and i > 0 else prefill_bootstrap
            slots.append(WorkerSlot(role, i, free_port(plan.host), bport, free_port(plan.host), gpu))
            gpu += plan.tp_size
    return slots


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
    ]
    # The simulator accepts (and ignores) the placement flags, so both engines get one command line.
    if plan.device == "gpu":
        argv += ["--base-gpu-id", str(slot.base_gpu_id)]
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
        from kvgate.sim.router import router_argv  # builds the real smg command line; imports nothing heavy

        self.plan.validate()
        self.plan = self.plan.resolved()
        if not self.plan.model_path:
            raise UsageError("--model-path is required (only --device cpu --release R has a default model)")
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="kvgate-pd-"))
        self.log_dir = log_dir
        # die_with_parent: workers holding GPUs must not outlive a kvgate that was SIGKILLed.
        sup = Supervisor(log_dir=log_dir, grace_s=10.0, die_with_parent=True)
        self.supervisor = sup
        env = dict(self.plan.env)
        try:
            workers: list[ManagedProcess] = []
            prefill_pairs: list[tuple[str, int]] = []
            for slot in plan_slots(self.plan):
                url = f"http://{self.plan.host}:{slot.port}"
                workers.append(sup.start(slot.name, worker_argv(self.plan, slot), ready_url=url + "/health", env=env))
                if slot.role == "prefill":
                    self.prefill_urls.append(url)
                    prefill_pairs.append((url, slot.bootstrap_port))
                else:
                    self.decode_urls.append(url)
            # The router only after every worker is ready: smg gives up on a worker that is not healthy
            # within its start-up timeout and never retries it, and a loaded machine can start slowly.
            sup.wait_ready(
                workers,
                deadline_s=self.plan.ready_deadline_s,
                poll_s=0.5,
                request_timeout_s=HEALTH_CHECK_TIMEOUT_S + 5.0,
            )
            rport = free_port(self.plan.host)
            self.router_url = f"http://{self.plan.host}:{rport}"
            router = sup.start(
                "router",
                router_argv(
                    prefill=prefill_pairs,
                    decode=self.decode_urls,
                    host=self.plan.host,
                    port=rport,
                    prometheus_port=free_port(self.plan.host),
                ),
                ready_url=self.router_url + "/readiness",
            )
            sup.wait_ready([router], deadline_s=min(300.0, self.plan.ready_deadline_s), poll_s=0.5)
            self._wait_serving(min(120.0, self.plan.ready_deadline_s))
        except BaseException:
            sup.stop()
            raise
        return self

    def _wait_serving(self, deadline_s: float) -> None:
        """Until one short request is served through the router: smg answers 503 "No prefill workers
        available" for a few seconds after /readiness turns 200 (measured on CPU, cpu-sglang.md)."""
        import json
        import time
        import urllib.error
        import urllib.request

        body = json.dumps({"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 1}}).encode()
        end = time.monotonic() + deadline_s
        last = ""
        while time.monotonic() < end:
            req = urllib.request.Request(
                f"{self.router_url}/generate", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - the router we started
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise SupervisorError(
            f"the router at {self.router_url} did not serve a request within {deadline_s:g} s "
            f"({last}); see {self.log_dir}"
        )

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def code_sources(self) -> dict[str, dict[str, str]]:
        """Where the code the workers run lives, when kvgate installed it (device cpu, a release): the
        defenses gate then reads that code instead of trusting the version string."""
        if self.plan.release is None:
            return {}
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
