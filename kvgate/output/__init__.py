"""What leaves the process: redaction, confined and atomic writes, the one output boundary and its
per-sink neutralisers, progress observers."""
