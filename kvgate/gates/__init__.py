"""Gates: each reads the target and returns findings."""
