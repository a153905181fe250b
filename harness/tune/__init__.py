"""The tuner: one `harness tune` process (`session`: open, run, finish) searches a
study's space under its time and memory budgets (`search/`), runs the final phases on
the main worker (`final/`: confirmation rounds, ablation, the study's files), and
settles what stopped or dead workers left (`recovery/`). `session` builds the parts
once and gives each stage those it uses; each trial is a `trial_job`. The tuner process never
imports torch: what needs it is asked of the torch-side helper through
harness.launch.torch_helper. It may import harness.launch, harness.study,
harness.records and harness.core; never harness.measure, harness.cli, strategies or
harness.estimator. docs/architecture.md draws the subpackages.
"""

from harness.tune.search.guided_sampler import CostModel, GuidedSampler, SimpleCostModel

__all__ = ["CostModel", "GuidedSampler", "SimpleCostModel"]
