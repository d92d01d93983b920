"""Defaults that the CLI's --help shows and the library uses: kept here so --help imports nothing heavy."""

SCAN_TIMEOUT_S = 60.0
"""Seconds a `--python` code scan (kvgate's scan program on a worker's interpreter) may take."""
