"""Probing gates (issue 4): what a PD deployment does at its limits, read from response bodies.

API:
- `ProbeGate(settings: ProbeSettings | None = None)`: a gate named "probes" (`run(ctx) -> list[Finding]`).
  It needs `ctx.options.router_url` and worker readings (limits come from gate 1's NodeReadings);
  without settings it validates `ctx.options.probes` itself (source: the profile name).
- `ProbeSettings.from_mapping(mapping, source)`: validated settings (keys documented on the class);
  a bad key or value raises `ProfileError(source, "probes.<key>", problem)`.
- `kvgate.gates.probes.selftest`: the positive control's shape and verdict (the pipeline,
  `kvgate.pipeline.check.run_self_test`, starts the simulator and runs it).
- `Verdict`: the contract's outcome classes (failure class names in finding summaries).

Check names (finding.check, gate "probes"): contract.{beyond_context,context_limit,pool_limit,
reject_band_middle,longest_accepted}, canary.round_a, canary.round_b, tenants.round_a, tenants.round_b,
isolation.greedy_replay, isolation.load, isolation.load_errors, handoff.prefill_oracle,
latency.prefill_scaling, abort.mid_transfer, calibration (info: what the timing probes were sized
from), plus setup / skipped / transport when they apply.
Cost keys put in `ctx.cost`: probe_requests, probe_tokens_sent, probe_prefill_tokens,
probe_over_limit_served_tokens, probe_wall_s, probe_prefill_ratio_of_context.
"""

from __future__ import annotations

from kvgate.gates.probes.contract import Verdict
from kvgate.gates.probes.gate import ProbeGate
from kvgate.gates.probes.settings import ProbeSettings

__all__ = ["ProbeGate", "ProbeSettings", "Verdict"]
