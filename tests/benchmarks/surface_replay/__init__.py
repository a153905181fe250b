"""Replaying searches against a simulated response surface (tests/benchmarks/surfaces):
the harness's own Tuner driven on a virtual clock (world.py, launcher.py, harness_run.py),
random search and the estimator's order (others.py), and the table (report.py).
`tests/benchmarks/search_replay.py --surface package.module:function` runs it."""
