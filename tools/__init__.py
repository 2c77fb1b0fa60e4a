"""Command-line tools: `python -m tools.repro FILE` replays a saved failure case,
`python -m tools.identify IMPL` finds which recipe an implementation computes."""
