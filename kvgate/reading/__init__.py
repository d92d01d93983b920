"""Reading the target: one parse of a URL, the bounded HTTP client, many reads at once, every field
of a worker's answers, the fleet reader, the router's worker list."""
