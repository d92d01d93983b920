"""Defaults that the CLI's --help shows and the library uses: kept here so --help imports nothing heavy."""

SCAN_TIMEOUT_S = 60.0
"""Seconds a `--python` code scan (kvgate's scan program on a worker's interpreter) may take."""

DEFAULT_CONCURRENCY = 1024
"""Workers whose metadata is read at once, by default (`--concurrency`; the watch's pass reads as many):
every GET of theirs in flight together on one thread (kvgate/reading/fleetread.py), so a fleet of 1,024 costs
about one slow answer."""

NODE_DEADLINE_REQUESTS = 3
"""A worker's whole read (up to five GETs) must finish within this many times the per-request timeout."""

DEFAULT_TIMEOUT = 10.0
"""Seconds one whole metadata answer may take (`--timeout`): connect, headers and every byte of the body."""

DEFAULT_READ_DEADLINE = 120.0
"""Seconds the whole metadata read of every worker may take (`--read-deadline`)."""

MIB = 1 << 20

METADATA_BODY_CAP = 16 * MIB
"""Bytes of one metadata answer (/server_info, /v1/models, /model_info, the router's /workers) kvgate reads;
a larger answer is a transport error naming the cap, never read whole."""

PROBE_BODY_CAP = 8 * MIB
"""Bytes of one probe answer (/generate, /v1/tokenize, a whole stream) kvgate reads."""

STREAM_LINE_CAP = 1 * MIB
"""Bytes of one line of a streamed answer (one SSE frame)."""

# The release `kvgate drill` and `kvgate sim up` reproduce when none is given: the incident's own.
INCIDENT_RELEASE = "0.5.19"
