"""The tools behind the `make` targets and the measurements in docs/results/: `python -m tools.NAME --help`."""
