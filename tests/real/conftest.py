"""The real-SGLang tier: a REAL prefill/decode pair of every release 0.5.19-0.5.23 on this CPU.

Each pair is `python -m sglang.launch_server` x2 (Mooncake over TCP) behind the real smg router,
started by kvgate's own launcher (`kvgate.launch`, device cpu) from the release's cached CPU
environment and kvgate's tiny model (kvgate.cpuserver). One pair is alive at a time: the fixture is
session-scoped and parametrized, so pytest groups every test of one pair together and stops it before
starting the next (about 2 GB of RAM per server); under `pytest -n 2` the whole tier is one unit of
work (tests/conftest.py), so one worker runs it in that order.

Per release two pairs: "short" (prefill pool 4,096 < context 8,192: the incident's shape) and
"healthy" (pool 10,240 = 1.25 x context on both sides). Both server modes run on every kind: the
even-indexed releases run "short" with --skip-tokenizer-init (input_ids in, output_ids out) and
"healthy" with the tokenizer; the odd-indexed ones the other way round.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvgate.launch import PDDeployment, PDLaunchPlan
from kvgate.upstream import RELEASES
from tests.assets.real_sglang import server_env_or_skip

CONTEXT = 8192
SHORT_POOL = 4096
HEALTHY_POOL = 10240


@dataclass(frozen=True)
class PairSpec:
    """One real PD pair: its release, its pool shape and its server mode."""

    release: str
    kind: str  # "short" | "healthy"
    skip_tokenizer_init: bool

    @property
    def prefill_pool(self) -> int:
        return SHORT_POOL if self.kind == "short" else HEALTHY_POOL

    @property
    def decode_pool(self) -> int:
        return HEALTHY_POOL

    @property
    def id(self) -> str:
        return f"{self.release}-{self.kind}-{'ids' if self.skip_tokenizer_init else 'text'}"


def _specs() -> list[PairSpec]:
    out = []
    for i, v in enumerate(RELEASES):
        out.append(PairSpec(v, "short", i % 2 == 0))
        out.append(PairSpec(v, "healthy", i % 2 == 1))
    return out


SPECS = _specs()


@dataclass
class RealPair:
    """A started real pair and where its logs are."""

    spec: PairSpec
    deployment: PDDeployment

    @property
    def router(self) -> str:
        assert self.deployment.router_url is not None
        return self.deployment.router_url

    @property
    def prefill(self) -> str:
        return self.deployment.prefill_urls[0]

    @property
    def decode(self) -> str:
        return self.deployment.decode_urls[0]

    def check_args(self) -> list[str]:
        """`kvgate check` against this pair, reading the code the workers run (the release's CPU env)."""
        return [
            "check",
            "--prefill-url",
            self.prefill,
            "--decode-url",
            self.decode,
            "--router-url",
            self.router,
            "--site-packages",
            self.deployment.code_sources()["*"]["site_packages"],
        ]


def plan_for(spec: PairSpec) -> PDLaunchPlan:
    """kvgate's own launch plan of a real pair (what `kvgate up --device cpu --release R` starts)."""
    return PDLaunchPlan(
        model_path=None,
        engine="sglang",
        device="cpu",
        release=spec.release,
        context_length=CONTEXT,
        prefill_max_total_tokens=spec.prefill_pool,
        decode_max_total_tokens=spec.decode_pool,
        skip_tokenizer_init=spec.skip_tokenizer_init,
        ready_deadline_s=600.0,
        # So the defenses gate reads the deferred-release setting the workers really run with.
        env={"SGLANG_EXPOSE_OWN_ENV_VARS": "1"},
    )


@pytest.fixture(scope="session", autouse=True)
def _one_worker_runs_this_tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail, rather than start real pairs on two xdist workers at once, if the scheduler in
    tests/conftest.py did not keep this tier one unit of work (the workers share basetemp's parent)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with open(tmp_path_factory.getbasetemp().parent / "real-tier.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail("another xdist worker is running the real tier: it must be one unit (tests/conftest.py)")
        yield


@pytest.fixture(scope="session", params=SPECS, ids=[s.id for s in SPECS])
def real_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealPair]:
    spec: PairSpec = request.param
    server_env_or_skip(spec.release)
    logs = tmp_path_factory.mktemp(f"real-{spec.id}")
    dep = PDDeployment(plan_for(spec), log_dir=logs)
    dep.start()
    try:
        yield RealPair(spec, dep)
    finally:
        dep.stop()


def report_of(path: Path) -> dict:
    return json.loads(path.read_text())
