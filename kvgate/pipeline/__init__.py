"""The pipeline: read the target, run the gates, read the fleet again before the verdict."""
