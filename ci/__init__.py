"""CI tooling: the per-cell wheel build, the plan, the preflight, torch-watch, the release upload."""
