"""The tuner: one `harness tune` process (`session`: open, run, finish) searches a
study's space under its time and memory budgets (`search/`), runs the final phases on
the main worker (`final/`: confirmation rounds, ablation, the study's files), and
settles what stopped or dead workers left (`recovery/`). `session` builds the parts
once and gives each stage those it uses; each trial is a `trial_job`. The tuner process never
imports torch: what needs it is asked of the torch-side helper through
training_harness.launch.torch_helper. It may import training_harness.launch,
training_harness.study, training_harness.records and training_harness.core; never
training_harness.measure, training_harness.cli, strategies or training_harness.estimator.
docs/architecture.md draws the subpackages.
"""

from training_harness.tune.search.guided_sampler import CostModel, GuidedSampler, SimpleCostModel

__all__ = ["CostModel", "GuidedSampler", "SimpleCostModel"]
