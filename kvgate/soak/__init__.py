"""`kvgate soak`: the gate over time, under production-shaped load (settings, load, content checks,
service levels, the workers' pool use; run.py composes them)."""
