"""kvgate's embedded SGLang prefill/decode (PD) simulator.

A target wherever there is no GPU: separate prefill and decode worker processes that serve SGLang's
HTTP surface, move KV over a loopback TCP transfer protocol on the prefill's bootstrap port, hold KV
in a paged numpy pool whose freed pages are NOT cleared, and behave like a chosen SGLang release
(0.5.19 .. 0.5.23) where releases differ for isolation. The REAL router from PyPI (`smg` 1.13.0)
runs in front. Each failure of the incident happens for real (shared/reference/incident.md):

* 0.5.19: an over-pool prompt (prefill `max_req_input_len` <= N < context) is admitted with a
  one-token placeholder; decode commits a one-page handoff and attends its whole reservation:
  HTTP 200, `prompt_tokens` = the caller's count, and text made of earlier requests' stale pages.
* 0.5.20: the prefill retires it after the forward (400 to the prefill's caller, no KV, no
  transfer-complete); decode keeps its reservation until its waiting timeout (then 500), or until
  the router's dropped connection is noticed (`SGLANG_REQUEST_STATE_WAIT_TIMEOUT`, 4 s).
  Through smg 1.13.0, a non-streaming client gets the prefill's 400 at once; a streaming client
  gets the decode's error only after the waiting timeout.
* 0.5.21+: the prefill retires it at its admission door with the original 400, before any
  bootstrap, and tells the decode nothing (kvgate's backport neither). A decode that admits the
  length (its own pool is larger) keeps its reservation and waits for the KV until its waiting
  timeout (then 500), or until it notices the router's dropped connection. Through smg 1.13.0 a
  non-streaming client gets the prefill's 400 at once; a streaming client hangs until the waiting
  timeout, and on a small decode pool the requests after it queue behind the held reservation.
* Deferred decode KV release (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE, off <= 0.5.20,
  on >= 0.5.21): when off, a decode-side abort mid-transfer frees pages at once and the prefill's
  late page writes land on the next request that gets them. From 0.5.20 the prefill posts nothing
  more once it learned of the abort and skips queued writes, so only a write already in flight lands:
  give the transfer a bandwidth (`transfer_tokens_per_s`) or nothing is ever in flight.

What the real server showed (tests/real/test_differential.py, real 0.5.19-0.5.23 on CPU)
-------------------------------------------------------------------------------------
The simulator answers to the real server: one probe set goes to both, and every outcome class must
match. Changed because the real server differed:
* a scheduler rejection (len >= max_req_input_len) of a STREAMING request is an HTTP 200 chunk with
  `output_ids: []`, `prompt_tokens: 1` and `finish_reason: {"type": "abort", "status_code": 400, ...}`
  (the simulator used to send an `{"error": ...}` event; only tokenizer rejections are error events);
* `--skip-tokenizer-init` (answers without `text`) is modelled;
* `server_info.kvgate_simulator: true` is how kvgate recognises the simulator (never a model path);
* a 0.5.21+ prefill's door reject reaches no decode: the simulator used to send the decode a failure
  message (its model of #36612's failure notification), so a streaming over-pool request got the 400
  at once; the real 0.5.21 and 0.5.23 decodes were never told, waited for the KV until the 300 s
  waiting timeout and held their pages meanwhile, so the streaming client hung. The simulator now
  does the same (kvgate's own backport does not notify either), and a decode's abort for a room no
  prefill request claimed is acknowledged at once, as SGLang's bootstrap thread does.

Library API (what probe tests use)
----------------------------------
    from kvgate.sim.deploy import SimDeployment

    with SimDeployment(emulate="0.5.19", prefill=1, decode=1, context_length=4096,
                       prefill_pool=1024, decode_pool=16384, page_size=16,
                       waiting_timeout=None,           # s; SGLANG_DISAGGREGATION_WAITING_TIMEOUT (300)
                       deferred_release=None,          # None = release default, or True/False
                       prefill_tokens_per_s=2e6,       # or one value per prefill worker
                       decode_tokens_per_s=0.0) as dep:
        dep.router_url      # "http://127.0.0.1:PORT"  (smg; /generate, /v1/completions, /v1/models, /readiness)
        dep.prefill_urls    # ["http://127.0.0.1:PORT"] (SGLang worker surface, /server_info, ...)
        dep.decode_urls     # ["http://127.0.0.1:PORT"]
        dep.bootstrap_ports # prefill bootstrap ports, in prefill order
        dep.info()          # {"router", "prefill", "decode", "bootstrap_ports", "emulate", "logs"}
        dep.pids            # every process (each leads its own process group)

More knobs: chunked_prefill_size, bootstrap_timeout, deferred_release_timeout, expose_env_vars
(SGLANG_EXPOSE_OWN_ENV_VARS=1), allow_auto_truncate, fixed_by ("kvgate-backport" or
"kvgate-backport-hardened" on 0.5.19/0.5.20: kvgate's own series, see releases.KvgateBackport),
kv_checksum (flag reported only, STUB: no checksum is computed), router=False (workers only),
log_dir, extra_env (e.g. {"SGLANG_REQUEST_STATE_WAIT_TIMEOUT": "1"}), ready_deadline_s.
Start-up takes ~2-3 s; `stop()` ~1 s.

Fleets: `prefill_pool` / `decode_pool` take one value per worker too (a fleet with one short pool);
`light=True` serves every worker's metadata and health from ONE process (`python -m kvgate.sim fleet`,
kvgate/sim/fleet.py; generation is a STUB answering 501), so 64 or 512 workers are cheap;
`metadata_delay_s` delays each metadata answer, `dp_size` makes light workers report DP ranks, and
`router_args` adds `smg launch` flags (e.g. ["--dp-aware"], a short health-check interval). On a
light worker, `POST /sim/health {"healthy": false}` turns its /health into 503.

To pin one request to a chosen prefill/decode pair (the router's policy picks otherwise), send it
the way the router does: `kvgate.sim.client.pd_generate(prefill_url, bootstrap_port, decode_url, body)`.

Aborts: SGLang's `POST /abort_request` ({"rid": ...} or {"abort_all": true}) on a worker aborts at
once; a client that disconnects is noticed, as in SGLang, only when the worker's wait times out
(SGLANG_REQUEST_STATE_WAIT_TIMEOUT, 4 s). Simulator-only endpoint on every worker (never used by
the router): `GET /sim/state` (free pages, in-flight transfers by rid with pages received,
counters such as `late_pages_received` = page writes that landed after the request freed them; on a
prefill also `running`, `aborted` and `rooms` with each room's `peer_aborted` and `pages_in_flight`).

The toy model: token id = byte (reversible byte tokenizer, id 0 = pad/placeholder). Decode reads
every slot it reserved, drops pad, keeps each distinct line once in order of first appearance, and
emits that digest byte by byte (cyclically) for `max_new_tokens` tokens. So put a sentinel on its
own line; filler lines that repeat collapse to one line. Prefill time = prompt tokens / prefill
speed, in chunks of `chunked_prefill_size`. Deterministic: no sampling randomness.

Command line: `kvgate sim up [--release 0.5.20] [--prefill N --decode M] [--context-length C]
[--prefill-pool P] [--decode-pool D] [--page-size S] [--waiting-timeout T]
[--deferred-release | --no-deferred-release]` prints the URLs and one JSON line
`{"router": URL, "prefill": [URL], "decode": [URL]}`, then stays up until Ctrl-C/SIGTERM.
One worker alone: `python -m kvgate.sim worker --disaggregation-mode prefill|decode --port P
--disaggregation-bootstrap-port B --context-length C --max-total-tokens POOL --page-size S --emulate V`.
"""

from __future__ import annotations

__all__: list[str] = []
