"""Results: frozen findings and the report with its exit status, waivers over findings, the
baseline file."""
