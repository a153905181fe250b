"""The tuner: one `harness tune` process (`session`) drives Optuna (`tuner`,
`sampling`, `storage`) over a study's search space under its time and memory
budgets (`budget`, `calibration`, `pruning`), runs each trial as a job
(`trial_job`; several at once when they run on Slurm, `in_flight`), then the
leave-one-out trials of the best (`ablation`); it recovers
trials a stopped worker left (`resume`), shares a study between workers and nodes
(`workers`, `follower`, `context`) and reports progress and the end (`progress`,
`summary`). The tuner process never imports torch: what needs it is asked of the
torch-side helper through harness.launch.probe. It may import harness.launch,
harness.measure (torch-free modules only), harness.study, harness.records and
harness.core; never harness.cli, strategies or harness.estimator.
"""
