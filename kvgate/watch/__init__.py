"""`kvgate watch`: the gate keeps watching after promotion (issue 22; incident.md section 5, checklist item 5).

One module per concern:
- `settings`: the profile's `watch:` section (interval, traffic budget, verdict age), validated;
- `budget`: the probe traffic budget (requests and prefill tokens per sliding minute), enforced and measured;
- `latency`: the latency-too-good signal over time (prefill durations by prompt-length bucket);
- `fleetpass`: the per-interval metadata pass (the router's listing and every worker's facts, read by
  the fleet reader `kvgate check` uses, kvgate/reading/fleetread.py) and every judged fact that differs from what
  the last full gate judged;
- `probes`: the scheduled content probes (sentinel-carrying latency samples, scanned for foreign sentinels);
- `metrics`: the Prometheus metrics (prometheus_client, imported only here);
- `endpoint`: the HTTP server for /metrics, /healthz and /verdict;
- `loop`: the watcher that ties them together.

Nothing here is imported by the core CLI at start-up: `kvgate watch` loads it when it runs.
"""
