"""Step time: the step's FLOPs per device over an assumed fraction of the device's peak,
stretched by the pipeline's bubble; on CUDA also its kernel launches, communication and
optimizer step (training_harness.estimator.step_costs)."""

from __future__ import annotations

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.estimator.bandwidth import bandwidth
from training_harness.estimator.step_costs import COMPUTE_MFU, StepCosts, cuda_step_time

# Assumed fraction of the peak FLOP rate a training step reaches. On CUDA the
# peak is the datasheet (or calibration-matmul) figure; on CPU it is a measured
# matmul peak, which a whole training step gets closer to.
ASSUMED_MFU = {"cuda": 0.4, "cpu": 0.5}


def step_time(
    flops_per_step: float,
    plan: Plan,
    env: RuntimeEnv,
    peak_flops: float | None,
    bubble: float = 0.0,
    costs: StepCosts | None = None,
    recompute_flops: float = 0.0,
) -> tuple[float | None, float, str, dict[str, float]]:
    """(step time or None without a peak, the assumed MFU, the sentence saying how, its
    parts: training_harness.estimator.result.STEP_PARTS; `recompute_flops` of `flops_per_step` are
    a checkpoint's recompute).

    Step time = FLOPs / world size / (peak x MFU) / (1 − bubble).
    """
    flops_per_device = flops_per_step / plan.world_size
    mfu = ASSUMED_MFU.get(env.device_type, ASSUMED_MFU["cpu"])
    if peak_flops is None or peak_flops <= 0:
        return None, mfu, "No peak FLOP rate was given: step time is not estimated.", {}
    share = recompute_flops / flops_per_step if flops_per_step else 0.0
    if env.device_type == "cuda" and costs is not None:
        seconds, how, parts = cuda_step_time(
            flops_per_device / (peak_flops * COMPUTE_MFU), costs,
            bandwidth(env.device_type, env.device_name), bubble, share)
        return seconds, COMPUTE_MFU, how, parts
    flops_s = flops_per_device / (peak_flops * mfu)
    seconds = flops_s / (1 - bubble)
    parts = {"compute": flops_s * (1 - share), "recompute": flops_s * share,
             "bubble": seconds - flops_s}
    how = (
        f"Step time = FLOPs per device ({flops_per_device:.3e}, the global batch of "
        f"{plan.batch_size} over {plan.world_size} device(s)) / ({peak_flops:.3e} FLOP/s "
        f"peak x assumed MFU {mfu:g}"
        + (", of a measured CPU peak" if env.device_type == "cpu" else "")
        + ")"
        + (f" / (1 − pipeline bubble {bubble:.3f})" if bubble else "")
        + "; communication and data loading are not counted."
    )
    return seconds, mfu, how, parts
