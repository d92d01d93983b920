"""`kvgate drill`: the whole gate against a deployment it starts, for demos, CI and operator drills.

Starts a PD deployment of the release to reproduce behind the real smg router: the embedded simulator
(`--engine sim`, the incident's own pool and context), or the REAL SGLang server of that release on
this CPU (`--engine sglang`: kvgate's CPU environment and tiny model, a context of 8,192 and a prefill
pool of 4,096, the incident's shape scaled down). Runs every gate of `kvgate check` against it, tears
it down, and exits as `check` would. With `--release 0.5.19` the gate must fail.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvgate.commands import options as opt
from kvgate.commands._common import (
    deprecated_alias,
    fatal_report,
    finish,
    handle_errors,
    logs_left,
    resolve_strict,
    with_anchors,
    with_notes,
)
from kvgate.defaults import INCIDENT_RELEASE
from kvgate.errors import Interrupted, KvgateError, UsageError
from kvgate.formats import ReportFormat

# The incident's numbers on the simulator; on the real server on CPU, its shape scaled to the tiny model.
DEFAULTS: dict[str, dict[str, int]] = {
    "sim": {"context": 1_048_576, "prefill_pool": 681_280, "decode_pool": 2_097_152, "page_size": 16},
    "sglang": {"context": 8192, "prefill_pool": 4096, "decode_pool": 10240, "page_size": 1},
}


def _deployment(
    engine: str,
    emulate: str,
    prefill: int,
    decode: int,
    context: int,
    prefill_pool: int,
    decode_pool: int,
    page_size: int,
    deferred_release: bool | None,
    skip_tokenizer_init: bool,
) -> Any:
    """A started-on-enter deployment of `engine`."""
    if engine == "sim":
        from kvgate.sim.deploy import SimDeployment

        return SimDeployment(
            emulate=emulate,
            prefill=prefill,
            decode=decode,
            context_length=context,
            prefill_pool=prefill_pool,
            decode_pool=decode_pool,
            page_size=page_size,
            deferred_release=deferred_release,
            expose_env_vars=True,
            skip_tokenizer_init=skip_tokenizer_init,
        )
    from kvgate.deploy.launch import PDDeployment, PDLaunchPlan
    from kvgate.upstream.releases import DEFERRED_ENV

    env = {"SGLANG_EXPOSE_OWN_ENV_VARS": "1"}
    if deferred_release is not None:
        env[DEFERRED_ENV] = "1" if deferred_release else "0"
    return PDDeployment(
        PDLaunchPlan(
            model_path=None,
            prefill=prefill,
            decode=decode,
            context_length=context,
            prefill_max_total_tokens=prefill_pool,
            decode_max_total_tokens=decode_pool,
            page_size=page_size,
            engine="sglang",
            device="cpu",
            release=emulate,
            skip_tokenizer_init=skip_tokenizer_init,
            env=env,
            ready_deadline_s=900.0,
        )
    )


def _logs(engine: str, dep: Any) -> tuple[str, ...]:
    what = "simulator logs" if engine == "sim" else "server logs"
    return logs_left(what, getattr(dep, "log_dir", None))


@handle_errors
def drill(
    release: str | None = opt.release("SGLang release to reproduce, 0.5.19-0.5.23 (default 0.5.19)."),
    emulate_old: str | None = opt.emulate_old(),
    engine: str = opt.engine("sim (the simulator) or sglang (the real server on CPU).", default="sim"),
    context_length: int | None = opt.context_length(
        "Context of every worker (default: sim 1,048,576, sglang 8,192).", min=16
    ),
    prefill_pool: int | None = opt.prefill_pool(
        "Prefill KV pool in tokens (default: sim 681,280, sglang 4,096).", min=16
    ),
    decode_pool: int | None = opt.decode_pool(
        "Decode KV pool in tokens (default: sim 2,097,152, sglang 10,240).", min=16
    ),
    prefill: int = opt.prefill(),
    decode: int = opt.decode(),
    page_size: int | None = opt.page_size("KV page size (default: sim 16, sglang 1)."),
    skip_tokenizer_init: bool = opt.skip_tokenizer_init("sglang engine: workers answer output_ids only."),
    deferred_release: bool | None = opt.deferred_release(
        "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE of the workers (default: the release's)."
    ),
    tenants: int | None = opt.tenants("Concurrent canary tenants per round."),
    keep_going: bool = opt.keep_going(),
    fmt: list[ReportFormat] = opt.format("Report format (repeatable)."),
    output: list[Path] = opt.output(),
    strict: bool | None = opt.strict(),
    quiet: bool = opt.quiet(),
    verbose: bool = opt.verbose(),
    sarif_anchor: Path | None = opt.sarif_anchor(),
) -> None:
    """Run the full gate against a PD deployment it starts: the simulator, or the real server on CPU."""
    from kvgate.formats.reporting import pair_outputs
    from kvgate.gates.base import CheckOptions
    from kvgate.output.progress import NullObserver, terminal_observer
    from kvgate.pipeline.check import run_check

    pairs = pair_outputs(list(fmt), list(output))
    probes: dict[str, object] = {}
    if tenants is not None:
        probes["tenants"] = tenants
    if keep_going:
        probes["early_stop"] = False
    observer = terminal_observer(quiet)
    is_strict, strict_source = resolve_strict(strict)
    dep: Any = None
    try:
        if engine == "sim":
            from kvgate.extras import require_sim

            require_sim("kvgate drill")
        from kvgate.upstream.releases import RELEASES

        emulate: str = deprecated_alias("--release", "--emulate", release, emulate_old) or INCIDENT_RELEASE
        if emulate not in RELEASES:
            raise UsageError(f"--release {emulate!r}: choose one of {', '.join(RELEASES)}")
        if engine not in DEFAULTS:
            raise UsageError(f"--engine {engine!r}: choose one of {', '.join(DEFAULTS)}")
        d = DEFAULTS[engine]
        if engine == "sglang":
            from kvgate.gates.profiles import load

            # The bundled profile sized for the tiny model's 8k context; the flags still win.
            probes = {**load("cpu-tiny").probes, **probes}
        context_length = context_length or d["context"]
        prefill_pool = prefill_pool or d["prefill_pool"]
        decode_pool = decode_pool or d["decode_pool"]
        dep = _deployment(
            engine,
            emulate,
            prefill,
            decode,
            context_length,
            prefill_pool,
            decode_pool,
            page_size or d["page_size"],
            deferred_release,
            skip_tokenizer_init,
        )
        what = "simulated" if engine == "sim" else "REAL (on CPU)"
        # A step, so that a start of minutes (the real server, a cold CPU environment) keeps saying so.
        with (observer or NullObserver()).step(
            f"starting a {what} SGLang {emulate} deployment: context {context_length:,}, "
            f"prefill pool {prefill_pool:,}, decode pool {decode_pool:,}"
        ):
            dep.start()
        with contextlib.ExitStack() as started:
            started.callback(dep.stop)
            assert dep.router_url is not None
            options = CheckOptions(
                prefill_urls=tuple(dep.prefill_urls),
                decode_urls=tuple(dep.decode_urls),
                router_url=dep.router_url,
                timeout=30.0,
                strict=is_strict,
                strict_source=strict_source,
                profile_name=f"drill {engine} {emulate}",
                probes=probes,
                code=dep.code_sources(),
                # The simulator runs no sglang code: the release it emulates is all there is to judge.
                defenses={"trust_version": True} if engine == "sim" else {},
            )
            report = replace(run_check(options, observer=observer), command="drill")
        report = with_notes(report, _logs(engine, dep))
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM: no verdict, and the logs it leaves are said
        report = with_notes(fatal_report("drill", Interrupted("drill")), _logs(engine, dep))
    except ImportError as exc:
        report = fatal_report("drill", UsageError(f"the drill needs kvgate[sim,router]: {exc}"))
    except KvgateError as exc:
        report = fatal_report("drill", exc)
    finish(with_anchors(report, sarif_anchor=sarif_anchor), pairs, verbose)
