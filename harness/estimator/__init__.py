"""Predicted peak memory and step time of a plan, without running it.

`estimate(plan, workload, env, peak_flops)` works out, per device (the largest
rank's):

- parameters, gradients and optimizer state, from the parameters of the model
  built on the meta device (tied weights once), as the plan's strategies split
  them: a pipeline rank's stages, tensor parallel's shards, ZeRO's stages over
  the data ranks (`state`: 4Ψ + 4Ψ + 8Ψ replicated; stage 1 optimizer state
  /N, stage 2 also gradients /N, stage 3 also parameters /N; offload: on the
  CPU), DDP's gradient buckets, FSDP's gathered parameters;
- activations: for transformers (`workload.shape` set) term by term after
  Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", eq. 1 (eq. 2 under tensor parallel), adapted to what
  PyTorch actually saves (see `block_activation_terms`); for other models by
  tracing one forward pass on fake tensors and adding up what autograd saves
  (`trace_activations`); under a pipeline, times the micro-batches each stage
  has in flight, plus the schedule's buffers (`pipeline`);
- the transient of the language-model loss, the 16-bit weight copies autocast
  keeps, the working set of a block's backward, under activation checkpointing
  the one block rebuilt at a time, gradients awaiting their reduction, and the
  optimizer step's temporaries.

These do not all live at once. The peak is the persistent state (parameters,
optimizer state, buffers) plus the largest of the moments of a step
(`Estimate.phases`): the end of forward, the start of backward (activations and
the loss's transient, no gradients yet: the step zeroes them with
`set_to_none=True`), the rebuild of a checkpointed block, and the
optimizer step (gradients and temporaries, the activations gone). The plain sum
of all components is kept as an upper bound (`Estimate.upper_bound_bytes`).
Step time is the step's FLOPs per device over an assumed fraction of the
device's peak, divided by 1 − the pipeline's bubble; communication is not
modelled. Every figure comes with sentences that state what it assumes
(`Estimate.assumptions`): the estimate is meant to be checked against
measurements, and those sentences say where it can be wrong.

The modules, one job each: `settings` (the plan's strategies and how they
split the work), `facts` (the model's parameters), `placement` (which of them
a rank holds), `state` (parameters, gradients, optimizer state on a rank),
`widths`, `transformer` and `lm` (a transformer's saved tensors, term by
term), `saved` and `trace` (any model's, traced), `activations` (either, for
one micro-batch), `pipeline` (bubble, micro-batches in flight, a stage's
activations), `phases` (the moments of a step), `rank` (one rank's memory),
`step_time`, `result` (Estimate), `assumptions` (the longer sentences) and
`estimate`, which puts them together.

It imports training_harness.core, training_harness.workloads and strategies (torch: it runs in the
tuner's torch-side helper, training_harness.measure.torch_helper_server, and in `harness bench` /
`harness estimate`), never the tuner, the launcher or the trial loop.
"""

from training_harness.estimator.estimate import estimate
from training_harness.estimator.phases import blocks_moment
from training_harness.estimator.pipeline import bubble_fraction, in_flight
from training_harness.estimator.result import COMPONENTS
from training_harness.estimator.settings import Parallelism
from training_harness.estimator.state import zero1_partition
from training_harness.estimator.transformer import block_activation_terms, korthikanti_bytes
from training_harness.estimator.widths import PAPER, widths_for

__all__ = [
    "COMPONENTS",
    "PAPER",
    "Parallelism",
    "block_activation_terms",
    "blocks_moment",
    "bubble_fraction",
    "estimate",
    "in_flight",
    "korthikanti_bytes",
    "widths_for",
    "zero1_partition",
]
