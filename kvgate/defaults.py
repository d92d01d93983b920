"""Defaults that the CLI's --help shows and the library uses: kept here so --help imports nothing heavy."""

SCAN_TIMEOUT_S = 60.0
"""Seconds a `--python` code scan (kvgate's scan program on a worker's interpreter) may take."""

DEFAULT_CONCURRENCY = 64
"""Workers whose metadata is read at once, by default (`--concurrency`)."""

NODE_DEADLINE_REQUESTS = 3
"""A worker's whole read (up to five GETs) must finish within this many times the per-request timeout."""
