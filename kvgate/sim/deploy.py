"""A whole simulated PD deployment: N prefill + M decode worker processes and the real router.

with SimDeployment(emulate="0.5.19", prefill=1, decode=1, context_length=4096,
                   prefill_pool=1024, decode_pool=16384, page_size=16) as dep:
    httpx.post(dep.router_url + "/generate", json={"text": "...", "sampling_params": {...}})
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgate.deploy.pdstart import DistinctPorts, PDLayout, WorkerProcess, start_pd
from kvgate.deploy.supervisor import Supervisor, http_ok
from kvgate.upstream.releases import RELEASES


@dataclass
class SimDeployment:
    """Start with `start()` or as a context manager; `stop()` tears every process group down.

    Knobs (SGLang's names where SGLang has the setting):
      emulate: "0.5.19" .. "0.5.23"; prefill / decode: worker counts.
      fixed_by: None, "kvgate-backport" or "kvgate-backport-hardened" (0.5.19/0.5.20 + kvgate's series).
      context_length: `--context-length` of every worker; prefill_pool / decode_pool: `--max-total-tokens`,
        one value or one per worker of that role (a fleet with one short pool).
      page_size: `--page-size`; chunked_prefill_size: `--chunked-prefill-size`.
      waiting_timeout: SGLANG_DISAGGREGATION_WAITING_TIMEOUT (s) for decode (SGLang: 300).
      bootstrap_timeout: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (s) (SGLang: 300).
      deferred_release: None = the release's default, else SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.
      deferred_release_timeout: SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (SGLang: 30).
      prefill_tokens_per_s: prefill compute speed, one value or one per prefill worker (0 = instant).
      decode_tokens_per_s: decode speed (0 = as fast as possible).
      transfer_tokens_per_s: KV transfer bandwidth; a posted chunk write lands size/bandwidth later and
        is "in flight" meanwhile (0 = instant).
      e2e_factor: a slow end-to-end deployment: an answer of more than one token takes this many times
        its time to the KV (arrival to transfer complete); the steps after the first token share the rest,
        so one-token requests (the calibration's) do not show it. 0 = off.
      expose_env_vars: SGLANG_EXPOSE_OWN_ENV_VARS=1.
      allow_auto_truncate: `--allow-auto-truncate` on every worker (each truncates to its OWN limit).
      skip_tokenizer_init: `--skip-tokenizer-init` on every worker (answers carry output_ids, no text).
      router: False starts the workers only (router_url is then None).
      router_args: extra `smg launch` arguments (e.g. a short health-check interval).
      light: metadata-only workers, all served by ONE `python -m kvgate.sim fleet` process (fleet.py):
        cheap enough for 64 or 512 workers; no generation (a STUB answering 501).
      metadata_delay_s: (light only) seconds every metadata answer takes.
      dp_size: (light only) DP ranks every worker reports (for smg's --dp-aware listing).
    """

    emulate: str = "0.5.20"
    fixed_by: str | None = None
    prefill: int = 1
    decode: int = 1
    context_length: int = 32768
    prefill_pool: int | Sequence[int] = 65536
    decode_pool: int | Sequence[int] = 65536
    page_size: int = 16
    chunked_prefill_size: int = 8192
    waiting_timeout: float | None = None
    bootstrap_timeout: float | None = None
    deferred_release: bool | None = None
    deferred_release_timeout: float | None = None
    prefill_tokens_per_s: float | Sequence[float] = 2_000_000.0
    decode_tokens_per_s: float = 0.0
    transfer_tokens_per_s: float = 0.0
    e2e_factor: float = 0.0
    expose_env_vars: bool = False
    kv_checksum: bool = False
    allow_auto_truncate: bool = False
    skip_tokenizer_init: bool = False
    #: `--enable-metrics` on every worker (kvgate's launch plan starts real workers with it too):
    #: the request counters probes.pd.* read.
    enable_metrics: bool = True
    router: bool = True
    router_args: Sequence[str] = ()
    light: bool = False
    metadata_delay_s: float = 0.0
    dp_size: int = 1
    host: str = "127.0.0.1"
    log_dir: Path | None = None
    ready_deadline_s: float = 120.0
    extra_env: dict[str, str] = field(default_factory=dict)

    router_url: str | None = field(default=None, init=False)
    prefill_urls: list[str] = field(default_factory=list, init=False)
    decode_urls: list[str] = field(default_factory=list, init=False)
    bootstrap_ports: list[int] = field(default_factory=list, init=False)
    supervisor: Supervisor | None = field(default=None, init=False)

    def _worker_env(self) -> dict[str, str]:
        env = {"PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}
        if self.waiting_timeout is not None:
            env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] = _num(self.waiting_timeout)
        if self.bootstrap_timeout is not None:
            env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] = _num(self.bootstrap_timeout)
        if self.deferred_release is not None:
            env["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"] = "true" if self.deferred_release else "false"
        if self.deferred_release_timeout is not None:
            env["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"] = _num(self.deferred_release_timeout)
        if self.expose_env_vars:
            env["SGLANG_EXPOSE_OWN_ENV_VARS"] = "1"
        env.update(self.extra_env)
        return env

    def _worker_argv(self, mode: str, port: int, bootstrap_port: int, pool: int, tps: float) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "kvgate.sim",
            "worker",
            "--disaggregation-mode",
            mode,
            "--host",
            self.host,
            "--port",
            str(port),
            "--disaggregation-bootstrap-port",
            str(bootstrap_port),
            "--context-length",
            str(self.context_length),
            "--max-total-tokens",
            str(pool),
            "--page-size",
            str(self.page_size),
            "--chunked-prefill-size",
            str(self.chunked_prefill_size),
            "--emulate",
            self.emulate,
            "--sim-prefill-tokens-per-s",
            _num(tps),
            "--sim-decode-tokens-per-s",
            _num(self.decode_tokens_per_s),
            "--sim-transfer-tokens-per-s",
            _num(self.transfer_tokens_per_s),
            "--sim-e2e-factor",
            _num(self.e2e_factor),
        ]
        if self.kv_checksum:
            argv.append("--disaggregation-enable-kv-checksum")
        if self.fixed_by:
            argv += ["--fixed-by", self.fixed_by]
        if self.allow_auto_truncate:
            argv.append("--allow-auto-truncate")
        if self.skip_tokenizer_init:
            argv.append("--skip-tokenizer-init")
        if self.enable_metrics:
            argv.append("--enable-metrics")
        return argv

    def start(self, attempts: int = 3) -> SimDeployment:
        """Start the workers, then the router, and wait until all are ready (`kvgate.deploy.pdstart`).

        Ports are picked free just before the children bind them; if another process takes one in
        between (other test runs on the same machine), the start is retried with fresh ports.
        """
        if self.emulate not in RELEASES:
            raise ValueError(f"emulate must be one of {RELEASES}")
        if self.prefill < 1 or self.decode < 1:
            raise ValueError("need at least one prefill and one decode worker")
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="kvgate-sim-"))
        self.log_dir = log_dir
        die_with_parent = threading.current_thread() is threading.main_thread()
        started = start_pd(
            lambda ports: self._layout(ports, log_dir),
            lambda: Supervisor(log_dir=log_dir, grace_s=3.0, die_with_parent=die_with_parent),
            host=self.host,
            env=self._worker_env(),
            ready_deadline_s=self.ready_deadline_s,
            router=self.router,
            router_args=self.router_args,
            attempts=attempts,
        )
        self.supervisor = started.supervisor
        self.router_url = started.router_url
        self.prefill_urls = [url for url, _ in started.layout.prefill]
        self.bootstrap_ports = [bport for _, bport in started.layout.prefill]
        self.decode_urls = list(started.layout.decode)
        return self

    def _layout(self, ports: DistinctPorts, log_dir: Path) -> PDLayout:
        """One process per worker, or (light) one fleet process serving every worker (its spec in `log_dir`)."""
        tps_list = _per_worker(self.prefill_tokens_per_s, self.prefill, "prefill_tokens_per_s")
        prefill_pools = _per_worker(self.prefill_pool, self.prefill, "prefill_pool")
        decode_pools = _per_worker(self.decode_pool, self.decode, "decode_pool")
        processes: list[WorkerProcess] = []
        light: list[dict[str, Any]] = []
        prefill: list[tuple[str, int]] = []
        decode: list[str] = []
        for i in range(self.prefill):
            port, bport = ports(), ports()
            url = f"http://{self.host}:{port}"
            if self.light:
                light.append(self._light_worker("prefill", port, bport, int(prefill_pools[i])))
            else:
                argv = self._worker_argv("prefill", port, bport, int(prefill_pools[i]), tps_list[i])
                processes.append(WorkerProcess(f"prefill{i}", tuple(argv), (url,)))
            prefill.append((url, bport))
        # Every decode names the first prefill's bootstrap port (the router passes the real one).
        first_bport = prefill[0][1]
        for i in range(self.decode):
            port = ports()
            url = f"http://{self.host}:{port}"
            if self.light:
                light.append(self._light_worker("decode", port, first_bport, int(decode_pools[i])))
            else:
                argv = self._worker_argv("decode", port, first_bport, int(decode_pools[i]), 0.0)
                processes.append(WorkerProcess(f"decode{i}", tuple(argv), (url,)))
            decode.append(url)
        if self.light:
            spec = log_dir / "fleet.json"
            spec.write_text(json.dumps({"metadata_delay_s": self.metadata_delay_s, "workers": light}))
            argv = [sys.executable, "-m", "kvgate.sim", "fleet", "--spec", str(spec)]
            processes.append(WorkerProcess("fleet", tuple(argv), tuple(url for url, _ in prefill) + tuple(decode)))
        return PDLayout(tuple(processes), tuple(prefill), tuple(decode))

    def _light_worker(self, mode: str, port: int, bootstrap_port: int, pool: int) -> dict[str, Any]:
        """The WorkerConfig fields of one metadata-only worker (fleet.py builds the config from them)."""
        return {
            "mode": mode,
            "host": self.host,
            "port": port,
            "disaggregation_bootstrap_port": bootstrap_port,
            "context_length": self.context_length,
            "max_total_tokens": pool,
            "page_size": self.page_size,
            "chunked_prefill_size": self.chunked_prefill_size,
            "emulate": self.emulate,
            "fixed_by": self.fixed_by,
            "disaggregation_enable_kv_checksum": self.kv_checksum,
            "allow_auto_truncate": self.allow_auto_truncate,
            "dp_size": self.dp_size,
            "launch_command": f"python -m kvgate.sim fleet (metadata-only {mode} worker on port {port})",
        }

    def restart_worker(self, role: str, index: int, *, pool: int, deadline_s: float = 60.0) -> None:
        """Stop one (non-light) worker and start it again on its ports with `--max-total-tokens pool`:
        a capacity change as an operator's restart makes it (the router keeps listing the URL)."""
        if self.supervisor is None or self.light:
            raise ValueError("restart_worker needs a started deployment of full workers")
        name = f"{role}{index}"
        old = next(p for p in reversed(self.supervisor.processes) if p.name == name and not p.stopped)
        assert old.popen is not None
        os.killpg(old.pid, signal.SIGTERM)
        old.popen.wait(timeout=deadline_s)
        old.stopped = True
        argv = list(old.argv)
        argv[argv.index("--max-total-tokens") + 1] = str(pool)
        url = (self.prefill_urls if role == "prefill" else self.decode_urls)[index]
        proc = self.supervisor.start(name, argv, ready_url=url + "/health", env=self._worker_env())
        self.supervisor.wait_ready([proc], deadline_s=deadline_s)

    def stop(self) -> None:
        """Stop everything (idempotent)."""
        if self.supervisor is not None:
            self.supervisor.stop()

    @property
    def pids(self) -> list[int]:
        """Pids of every process of the deployment (each leads its own process group)."""
        return self.supervisor.pids() if self.supervisor else []

    def code_sources(self) -> dict[str, dict[str, str]]:
        """None: the simulator runs no sglang code, so the defenses gate can only read its version label."""
        return {}

    def info(self) -> dict[str, Any]:
        """`{"router": URL, "prefill": [URL], "decode": [URL]}` plus bootstrap ports and the log folder."""
        return {
            "router": self.router_url,
            "prefill": self.prefill_urls,
            "decode": self.decode_urls,
            "bootstrap_ports": self.bootstrap_ports,
            "emulate": self.emulate,
            "logs": str(self.log_dir),
        }

    def healthy(self) -> bool:
        """True when every worker answers /health (and the router /readiness)."""
        urls = [u + "/health" for u in self.prefill_urls + self.decode_urls]
        if self.router_url:
            urls.append(self.router_url + "/readiness")
        return all(http_ok(u) for u in urls)

    def __enter__(self) -> SimDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _per_worker(value: float | Sequence[float], count: int, name: str) -> list[float]:
    """One value per worker: a scalar is repeated; a sequence must have exactly `count` items."""
    if isinstance(value, Sequence):
        if len(value) != count:
            raise ValueError(f"{name}: give one value or one per worker ({count})")
        return [float(v) for v in value]
    return [float(value)] * count
