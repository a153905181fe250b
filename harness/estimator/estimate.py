"""`estimate`: a plan's predicted peak memory and step time, put together."""

from __future__ import annotations

from training_harness.core.device import RuntimeEnv
from training_harness.core.overhead import DeviceOverhead
from training_harness.core.plan import Plan
from training_harness.estimator.activations import (
    ActivationParts,
    traced_activations,
    transformer_activations,
)
from training_harness.estimator.assumptions import (
    checkpoint_assumption,
    parallel_assumptions,
    peak_assumption,
    state_assumptions,
)
from training_harness.estimator.compression import wire_bytes
from training_harness.estimator.facts import ModelFacts
from training_harness.estimator.lm import fused_loss_bytes
from training_harness.estimator.memo import model_facts
from training_harness.estimator.pipeline import bubble_fraction
from training_harness.estimator.profiled_step import DeviceProfile, plan_step
from training_harness.estimator.rank import PERSISTENT, RankMemory, rank_memory
from training_harness.estimator.result import Estimate
from training_harness.estimator.settings import Settings
from training_harness.estimator.step_costs import StepCosts
from training_harness.estimator.step_time import step_time
from training_harness.estimator.teacher import teacher_cost
from training_harness.estimator.trace import TraceFailed, trace_activations, untraced
from training_harness.workloads.base import Workload


def estimate(
    plan: Plan,
    workload: Workload,
    env: RuntimeEnv,
    peak_flops: float | None = None,
    flops_per_sample: float | None = None,
    overhead: DeviceOverhead | None = None,
    workload_key: str | None = None,
    profile: DeviceProfile | None = None,
) -> Estimate:
    """Predicted per-device peak memory and step time of `plan`; nothing is run.

    The memory is the largest rank's. `peak_flops` is the device's peak FLOP rate
    (the one MFU uses, training_harness.measure.peaks); without it the step time is None.
    `flops_per_sample`, when the caller counted it already, is not counted again.
    `overhead` (training_harness.measure.device_overhead, on CUDA) is what the process holds
    beyond its tensors; the peak counts it, so that it predicts what the device holds.
    `workload_key`: the name and arguments `workload` was loaded from, when it was
    (training_harness.measure.prepare): its model is then read once per key in this process.
    `profile`, this device's measured profile (training_harness.measure.device_profile):
    the step is then costed operator by operator (training_harness.estimator.profiled_step)
    where it can be, else as without one, saying why.
    Strategy settings the plan leaves out take the strategies' defaults; a bad
    setting is a HarnessError.
    """
    cfg = Settings.of(plan)
    par = cfg.parallel
    facts = model_facts(workload, cfg.lora, workload_key)
    b = plan.micro_batch_size
    assumptions = state_assumptions(facts, cfg, b)
    parts = activation_parts(workload, facts, cfg, env.device_type, b)
    ranks = [rank_memory(parts, facts, cfg, env.device_type, r) for r in range(par.pipeline)]
    peaks = [r.peak for r in ranks]
    worst = ranks[peaks.index(max(peaks))]
    bubble = bubble_fraction(par.pipeline, par.microbatches, par.virtual)
    assumptions += parallel_assumptions(cfg, plan.layout, worst, peaks, bubble)
    assumptions += parts.assumptions
    if parts.checkpointed:
        layers = workload.shape.layers if workload.shape is not None else facts.blocks
        assumptions.append(
            checkpoint_assumption(cfg.checkpoint_every, len(parts.checkpointed), layers)
        )
    held = None
    if worst.grads_held:
        held = "those DDP's buckets keep" if par.ddp and par.data > 1 else (
            "those of earlier micro-steps"
        )
    assumptions.append(peak_assumption(held, bool(worst.memory["gradient_buckets"])))

    if flops_per_sample is None:
        flops_per_sample = float(workload.flops_per_sample())
    if cfg.sparse_attention is not None:  # the attention term at its computed blocks' share
        from training_harness.strategies.sparse_attention import attention_flops_per_sample

        share = cfg.sparse_attention.computed_fraction(workload.tokens_per_sample)
        flops_per_sample -= attention_flops_per_sample(workload) * (1.0 - share)
    flops_per_step = (flops_per_sample + parts.recompute_flops_per_sample) * plan.batch_size
    teacher = teacher_cost(plan, workload, b)  # distillation: beside the student
    taught = teacher.forward_flops_per_sample * plan.batch_size if teacher else 0.0
    costs = step_costs(plan, workload, facts, cfg, worst)
    seconds, mfu, how, step_parts = step_time(
        flops_per_step + taught, plan, env, peak_flops, bubble, costs,
        recompute_flops=parts.recompute_flops_per_sample * plan.batch_size)
    if profile is not None and profile.device_type == env.device_type:
        profiled = plan_step(plan, workload, cfg, facts, profile, bubble, workload_key,
                             int(max(worst.phases.values(), default=0)))
        if isinstance(profiled, str):
            how += f" (The device profile was not used: {profiled}.)"
        else:
            seconds, how, step_parts = profiled.seconds, profiled.how, profiled.parts
            if peak_flops:  # the MFU this step time implies
                mfu = flops_per_step / plan.world_size / (seconds * peak_flops)
    assumptions.append(how)

    memory = {k: int(v) for k, v in worst.memory.items()}
    extra = device_terms(memory, cfg, overhead if env.device_type == "cuda" else None)
    if extra:
        assumptions.append(overhead_assumption(memory, overhead))
    memory["distill_teacher"] = teacher.bytes if teacher else 0
    if teacher:
        assumptions.append(teacher.assumption())
        extra += teacher.bytes
    return Estimate(
        peak_memory_bytes=int(worst.peak) + extra,
        step_time_s=seconds,
        memory=memory,
        flops_per_step=flops_per_step,
        assumptions=assumptions,
        phases={k: int(v) for k, v in worst.phases.items()},
        upper_bound_bytes=sum(memory.values()),
        block_terms=parts.block_terms,
        assumed_mfu=mfu,
        sharding=sharding_record(cfg, worst),
        pipeline={
            "stages": par.pipeline,
            "virtual_stages": par.virtual,
            "schedule": par.schedule if par.pipeline > 1 else None,
            "microbatches": par.microbatches,
            "bubble": bubble,
            "in_flight": [r.in_flight for r in ranks],
            "stage_memory_bytes": [int(p) + extra for p in peaks],
            "stage_parameters_bytes": [r.state.parameters for r in ranks],
            "stage_persistent_bytes": [sum(r.memory[k] for k in PERSISTENT) for r in ranks],
            "largest_rank": peaks.index(max(peaks)),
        },
        tensor={"ranks": par.tensor, "mlp": par.tensor_mlp},
        device_overhead_bytes=extra - memory["distill_teacher"],
        step_parts={k: float(v) for k, v in step_parts.items()},
    )


def device_terms(memory: dict[str, int], cfg: Settings, overhead: DeviceOverhead | None) -> int:
    """Put the device's own terms into `memory` (CUDA context with the workspaces, and
    NCCL's buffers per communicator: one per parallel axis with several ranks); their sum."""
    memory["device_context"] = memory["nccl_buffers"] = 0
    if overhead is None:
        return 0
    par = cfg.parallel
    communicators = sum(n > 1 for n in (par.data, par.tensor, par.pipeline))
    memory["device_context"] = overhead.context_bytes + overhead.workspace_bytes
    memory["nccl_buffers"] = communicators * overhead.nccl_bytes_per_communicator
    return memory["device_context"] + memory["nccl_buffers"]


def overhead_assumption(memory: dict[str, int], overhead: DeviceOverhead) -> str:
    from training_harness.core.units import format_bytes

    text = (f"device: CUDA context {format_bytes(overhead.context_bytes)} + cuBLAS/attention "
            f"workspaces {format_bytes(overhead.workspace_bytes)}")
    if memory.get("nccl_buffers"):
        text += (f" + NCCL {format_bytes(memory['nccl_buffers'])} (a one-rank "
                 "communicator's, per parallel axis: a floor, peers add buffers)")
    return text + f" ({overhead.source})"


def step_costs(plan: Plan, workload: Workload, facts: ModelFacts, cfg: Settings,
               worst: RankMemory) -> StepCosts:
    """What one rank's step launches and moves, for the step time on a GPU."""
    par, shape = cfg.parallel, workload.shape
    layers = shape.layers if shape is not None else (facts.blocks or 0)
    model = facts.parameter_bytes // (par.tensor * par.pipeline)
    # gradients are reduced, and the optimizer steps, for the trainable parameters only
    trained = sum(p.bytes for p in facts.params if p.trainable) // (par.tensor * par.pipeline)
    stepped = sum(p.trainable for p in facts.params)
    width = 2 if cfg.amp else 4
    act = plan.micro_batch_size * shape.seq_len * shape.hidden * width if shape else 0
    return StepCosts(
        microsteps=max(1, par.microbatches), blocks=max(1, layers // par.pipeline),
        compiled=cfg.compile, data=par.data, zero=par.zero, model_bytes=model,
        state_touched_bytes=worst.state.parameters + worst.state.optimizer_state,
        gradient_bytes=trained, param_tensors=max(1, stepped // par.pipeline),
        optimizer_impl=cfg.optimizer_impl, tensor=par.tensor, activation_bytes=act,
        wire_bytes=wire_bytes(facts.params, par) if par.ddp and par.zero == 0 else None,
        head_kernels=fused_loss_kernels(plan, workload) if cfg.linear_cross_entropy else 0)


# Launches per chunk of the fused linear cross-entropy: forward's matmul, cast, log-sum-exp,
# gather, loss, softmax (sub, exp), scatter, scale, cast, two matmuls (kernels.linear_cross_entropy)
FUSED_LOSS_KERNELS_PER_CHUNK = 13


def fused_loss_kernels(plan: Plan, workload: Workload) -> int:
    """The fused linear cross-entropy's kernel launches per micro-step: a few per chunk."""
    from training_harness.strategies.kernel_swaps import chunk_rows

    vocab = getattr(workload, "vocab", None) or getattr(workload.shape, "vocab", 0)
    tokens = plan.micro_batch_size * (workload.tokens_per_sample or 0)
    if not vocab or not tokens:
        return 0
    return FUSED_LOSS_KERNELS_PER_CHUNK * -(-tokens // chunk_rows(vocab, tokens))


def sharding_record(cfg: Settings, worst: RankMemory) -> dict:
    """How the data-parallel strategy holds the state, on the largest rank."""
    par, st = cfg.parallel, worst.state
    strategy = "zero" if par.zero else ("ddp" if par.ddp else "none")
    return {
        "strategy": strategy,
        "stage": par.zero,
        "data_ranks": par.data,
        "offload": par.offload,
        "mixed_precision": par.fsdp_mixed,
        "parameters_bytes": st.parameters,
        "gradients_bytes": st.gradients,
        "optimizer_state_bytes": st.optimizer_state,
        "cpu_bytes": st.offloaded,
        "gathered_parameters_bytes": st.gathered,
    }


def activation_parts(
    workload: Workload,
    facts: ModelFacts,
    cfg: Settings,
    device_type: str,
    batch: int,
) -> ActivationParts:
    """A transformer's activations term by term, other models' traced."""
    amp = cfg.amp is not None
    shape = workload.shape
    # A language model: its head and loss act on every token (the GPT). Other
    # models' outside of the blocks is traced (a ViT's head sees one token).
    lm = shape is not None and workload.tokens_per_sample is not None
    trace = None
    if shape is None or not lm or facts.attention_cores is None:
        try:
            trace = trace_activations(workload, batch, amp, device_type, cfg.checkpoint_every,
                                      cfg.linear_cross_entropy)
        except TraceFailed as e:  # measured only: said in one line
            trace = untraced(e.line)
    if shape is not None:
        parts = transformer_activations(shape, lm, cfg, facts, device_type, batch, trace)
    else:
        assert trace is not None
        parts = traced_activations(trace, batch)
        if cfg.checkpoint_every and facts.blocks is None:
            parts.assumptions.append(
                "The model has no `blocks` ModuleList: checkpointing is not modelled."
            )
        if cfg.linear_cross_entropy:  # hf: causal LMs: the trace ran the fused loss
            fused_loss_chunk(parts, workload, batch, amp)
    if trace is not None:
        parts.assumptions[:0] = trace.notes
    if trace is not None and amp:
        parts.assumptions.append(
            "The trace runs CPU autocast in bf16"
            + (", with CUDA's fp32 norms and softmax emulated." if device_type == "cuda"
               else ".")
        )
    return parts


def fused_loss_chunk(parts: ActivationParts, workload: Workload, batch: int, amp: bool) -> None:
    """A traced language model under fused linear_cross_entropy: what the trace saved
    holds the head weight's gradient already; the forward's one chunk of logits is a
    transient the trace does not keep, counted here at the end of forward."""
    vocab = getattr(workload, "vocab", None)
    hidden = getattr(getattr(workload, "config", None), "hidden_size", None)
    tokens = batch * (workload.tokens_per_sample or 0)
    if not isinstance(vocab, int) or not isinstance(hidden, int) or not tokens:
        return
    chunk, _, rows = fused_loss_bytes(vocab, hidden, tokens, 2 if amp else 4)
    parts.loss_forward = max(parts.loss_forward, chunk)
    parts.assumptions.append(
        f"The fused linear cross-entropy (fused linear_cross_entropy) never holds the "
        f"logits: the trace counts what it keeps (the hidden state's and the head "
        f"weight's gradients) and, at the end of forward, one chunk of {rows:,} tokens' "
        f"logits and their gradient ({chunk:,} bytes)."
    )
