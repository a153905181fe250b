"""Pipeline parallel: the GPT split into stages run by torch.distributed.pipelining.

The blocks are split evenly over `pipeline x virtual_stages` stages: the first
stage also holds the embeddings, the last one the final norm, the LM head and
the loss. Pipeline rank p holds stages p, p + P, p + 2P, ... (P = layout
pipeline), the looped placement the interleaved schedule expects. The plan's
micro-batches (global batch / (micro-batch x data)) are the schedule's; torch's
schedule runs forward and backward and scales the gradients by 1/micro-batches,
so the step is the same mean loss as the unsplit model's.

The split is built by hand rather than traced: it is short, and the stage
modules stay ordinary modules that zero's FSDP2 shards afterwards (DDP on
stages is refused: torch's schedules do not drive its reducer correctly). The LM head
cannot share the embedding's weight across stages, so tied weights are refused.

An `hf:` decoder is cut at decoder-layer boundaries where transformers marks its forward
as cut so (`base_model_pp_plan`: embed_tokens -> layers -> norm: Llama, Qwen2, Mistral
...). A stage holds a run of decoder layers, plus the token embedding (first stage) or
the final norm and LM head (last), and builds what the layers take besides the hidden
states itself: the rotary position embeddings, and the causal mask for eager attention
(SDPA gets none and runs causal). Models without such a plan (GPT-2, BERT) are refused
with the reason, as are tied embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule

from training_harness.core.config import from_table
from training_harness.core.errors import HarnessError
from training_harness.strategies.base import Choice, Phase, Strategy
from training_harness.strategies.mesh import group
from training_harness.strategies.registry import register
from training_harness.workloads import load_workload
from training_harness.workloads.gpt import GPT, GPTConfig
from training_harness.workloads.hf import HFWorkload, lm_loss
from training_harness.workloads.hf_head import criterion_of

# torch.distributed.pipelining is imported when a schedule is built: it imports
# triton, which the kernel tests need to import first (in interpreter mode).
SCHEDULES = {
    "gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B"
}
HF_PARTS = ("embed_tokens", "layers", "norm")  # of an hf: decoder's model.model, with lm_head


@dataclass
class PipelineSettings:
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = "1f1b"
    stages: int = 0  # pipeline ranks; 0 = layout pipeline (any other value must equal it)
    microbatches: int = 0  # 0 = the plan's: global batch / (micro_batch_size x data)
    virtual_stages: int = 1  # stages per rank: 2 or more for interleaved-1f1b

    def validate(self, where: str) -> None:
        for name in ("stages", "microbatches"):
            if getattr(self, name) < 0:
                raise HarnessError(f"{where}.{name}: must be 0 (follow the plan) or more")
        if self.virtual_stages < 1:
            raise HarnessError(f"{where}.virtual_stages: must be 1 or more")


class Stages(nn.ModuleList):
    """This rank's stage modules, in stage order: what the optimizer and the
    data-parallel wrappers see in place of the whole model."""

    def __init__(self, modules, ids: list[int], total: int, loss_fn):
        super().__init__(modules)
        self.ids, self.total = ids, total
        self.loss_fn = loss_fn  # (logits, targets) -> mean loss, on the last stage


def local_stages(model: nn.Module) -> Stages | None:
    """The model's stages on this rank when it is split into a pipeline, else None."""
    return model if isinstance(model, Stages) else None


class GPTStage(nn.Module):
    """Consecutive GPT blocks, plus the embeddings (first stage) or the head (last)."""

    def __init__(self, gpt: GPT, blocks: range, first: bool, last: bool):
        super().__init__()
        self.dropout = gpt.cfg.dropout
        self.wte = gpt.wte if first else None
        self.wpe = gpt.wpe if first else None
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in blocks)
        self.ln_f = gpt.ln_f if last else None
        self.lm_head = gpt.lm_head if last else None
        # fused linear_cross_entropy: the last stage hands on ln_f's output, and the loss
        # takes the head's weight from here (`fused_head_loss_fn`)
        self.head_in_loss = getattr(gpt.criterion, "fuses_head", False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:  # x: token ids
            pos = torch.arange(x.size(1), device=x.device)
            x = F.dropout(self.wte(x) + self.wpe(pos), self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        if self.lm_head is not None:
            x = self.ln_f(x)
            if not self.head_in_loss:
                x = self.lm_head(x)
        return x


def fused_head_loss_fn(stages: list[nn.Module], criterion):
    """The schedule's loss under fused linear_cross_entropy: the last stage returns the
    head's input, and the loss fuses the head (its weight, held by that stage, so its
    optimizer, FSDP and gradient are the stage's) with the cross-entropy. None on the
    ranks without the last stage (they compute no loss)."""
    last = [s for s in stages if s.lm_head is not None]
    if not last:
        return None
    stage, head = last[0], last[0].lm_head

    def loss_fn(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if isinstance(stage, FSDPModule):  # zero 3 resharded it after the stage's forward
            stage.unshard()
        return criterion(hidden.reshape(-1, hidden.size(-1)), head.weight,
                         targets.reshape(-1), head.bias)

    return loss_fn


def hf_reasons(workload: HFWorkload, stages: int) -> list[str]:
    c, t = workload.config, workload.source.model_type
    if not getattr(c, "base_model_pp_plan", None) or not workload.causal:
        return [f"pipeline: transformers gives '{t}' no base_model_pp_plan, so its forward "
                "cannot be cut at decoder-layer boundaries here; leave pipeline out"]
    out = []
    if c.num_hidden_layers % stages:
        out.append(f"pipeline: {c.num_hidden_layers} decoder layers do not split evenly into "
                   f"{stages} stages; choose num_hidden_layers as a multiple of {stages}")
    if getattr(c, "output_router_logits", False):
        out.append("pipeline stages pass hidden states only, so a mixture of experts' router "
                   "loss (output_router_logits) would be dropped; set output_router_logits = "
                   "false in [workload] to pipeline it without")
    if getattr(c, "tie_word_embeddings", False):
        out.append("pipeline cannot tie the LM head to the token embedding: they sit on the "
                   "last and the first stage; set tie_word_embeddings = false in [workload]")
    return out


def causal_mask(x: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, T] additive mask: 0 on and below the diagonal, the dtype's minimum above."""
    t = x.size(1)
    upper = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    return torch.zeros(t, t, device=x.device).masked_fill(upper, torch.finfo(torch.float32).min)[
        None, None
    ]


class HFStage(nn.Module):
    """Consecutive decoder layers (`blocks`), plus the embedding or the norm and head."""

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool):
        super().__init__()
        base = model.model
        self.config = model.config
        self.embed_tokens = base.embed_tokens if first else None
        self.blocks = nn.ModuleList(base.layers[i] for i in layers)
        self.norm = base.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.rotary_emb = getattr(base, "rotary_emb", None)  # buffers only, no parameters
        # fused linear_cross_entropy: the last stage hands on the norm's output, and the
        # loss takes the head's weight from here (fused_head_loss_fn)
        self.head_in_loss = criterion_of(model) is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:  # x: token ids
            x = self.embed_tokens(x)
        pos = torch.arange(x.size(1), device=x.device)[None]
        extra = {"position_ids": pos}
        if self.rotary_emb is not None:
            extra["position_embeddings"] = self.rotary_emb(x, pos)
        eager = self.config._attn_implementation == "eager"
        mask = causal_mask(x) if eager else None
        for layer in self.blocks:
            out = layer(x, attention_mask=mask, **extra)
            x = out[0] if isinstance(out, tuple) else out  # a tuple before transformers 5
        if self.lm_head is not None:
            x = self.norm(x)
            if not self.head_in_loss:
                x = self.lm_head(x)
        return x


def hf_splittable(model: nn.Module) -> bool:
    base = getattr(model, "model", None)
    return hasattr(model, "lm_head") and all(hasattr(base, p) for p in HF_PARTS)


def hf_stages(model: nn.Module, ids: list[int], total: int) -> list[HFStage]:
    """Stage modules `ids` of `total`, each an even share of the decoder layers."""
    per = len(model.model.layers) // total
    return [HFStage(model, range(s * per, (s + 1) * per), s == 0, s == total - 1) for s in ids]


class Pipeline(Strategy):
    name = "pipeline"
    summary = ("pipeline parallel: GPT blocks (or an hf: decoder's layers) split into stages, "
               "GPipe / 1F1B / interleaved 1F1B")
    phases = (Phase.PIPELINE, Phase.STEP)
    Settings = PipelineSettings
    requires = ("the gpt workload with tie_weights = false, or an hf: decoder with a "
                "base_model_pp_plan and untied embeddings; layout pipeline >= 2")
    distributed = True

    def space(self):
        return {
            "schedule": Choice(("gpipe", "1f1b", "interleaved-1f1b")),
            "virtual_stages": Choice((1, 2)),
        }

    def check(self, settings, plan, env):
        p, v = plan.layout.pipeline, settings.virtual_stages
        reasons = model_reasons(plan, p, v)
        if reasons is None:
            return [f"pipeline splits the built-in gpt workload and hf: decoders only, not "
                    f"'{plan.workload}'"]
        if p < 2:
            reasons.append("pipeline needs layout pipeline = 2 or more (the number of stages)")
        if settings.stages not in (0, p):
            reasons.append(
                f"pipeline stages = {settings.stages} but layout pipeline = {p}; "
                f"set stages = {p} (or 0 to follow the layout)"
            )
        if settings.schedule == "interleaved-1f1b" and v < 2:
            reasons.append("pipeline schedule 'interleaved-1f1b' needs virtual_stages = 2 or more")
        if settings.schedule != "interleaved-1f1b" and v != 1:
            reasons.append(
                f"pipeline schedule '{settings.schedule}' runs one stage per rank; set "
                "virtual_stages = 1 or schedule = 'interleaved-1f1b'"
            )
        try:
            n = plan.accumulation_steps
        except HarnessError as e:
            return reasons + [str(e)]
        per = plan.micro_batch_size * plan.layout.data  # samples a micro-batch
        if settings.microbatches not in (0, n):
            reasons.append(
                f"pipeline microbatches = {settings.microbatches} but the plan makes {n} "
                f"micro-batches (global batch / (micro_batch_size x data)); set "
                f"global_batch_size = {settings.microbatches * per} or microbatches = 0"
            )
        if settings.schedule == "1f1b" and n < p:
            reasons.append(
                f"pipeline schedule '1f1b' needs at least as many micro-batches as stages "
                f"({n} < {p}); set global_batch_size = {p * per}"
            )
        if settings.schedule == "interleaved-1f1b" and n % max(1, n // p):
            reasons.append(
                f"pipeline schedule 'interleaved-1f1b' needs the micro-batches ({n}) to be a "
                f"multiple of the rounds ({max(1, n // p)} = micro-batches // stages)"
            )
        if plan.strategies.get("amp", {}).get("dtype") == "fp16":
            reasons.append(
                "pipeline with amp fp16 is not supported: the schedule runs backward itself, "
                "so the loss cannot be scaled; use amp dtype = 'bf16'"
            )
        return reasons

    def apply(self, phase, setup, settings):
        if phase is Phase.PIPELINE:
            split(setup, settings)
        else:
            build_schedule(setup, settings)


def model_reasons(plan, p: int, v: int) -> list[str] | None:
    """What the model needs to be cut into p x v stages; None: a model not split here."""
    if plan.workload.startswith("hf:"):
        try:
            return hf_reasons(load_workload(plan.workload, dict(plan.workload_args)), p * v)
        except HarnessError as e:
            return [str(e)]
    if plan.workload != "gpt":
        return None
    try:
        cfg = from_table(GPTConfig, dict(plan.workload_args), "[workload]")
    except HarnessError as e:
        return [str(e)]
    reasons = []
    if cfg.layers % (p * v):
        reasons.append(
            f"pipeline: {cfg.layers} layers do not split evenly into {p} stages x {v} "
            f"virtual stages; choose layers as a multiple of {p * v}"
        )
    if cfg.tie_weights:
        reasons.append(
            "pipeline cannot tie the LM head to the token embedding: they sit on the "
            "last and the first stage; set tie_weights = false in [workload]"
        )
    return reasons


def split(setup, settings) -> None:
    """Replace the model by this rank's stage modules (the rest is dropped)."""
    model = setup.model
    pp = group(setup.mesh, "pipeline", "pipeline")
    rank, size = pp.rank(), pp.size()
    total = size * settings.virtual_stages
    ids = list(range(rank, total, size))  # looped placement
    if hf_splittable(model):
        modules = hf_stages(model, ids, total)
        fused = criterion_of(model)  # fused linear_cross_entropy
        loss = fused_head_loss_fn(modules, fused) if fused is not None else None
        setup.model = Stages(modules, ids, total, loss or lm_loss)
        per = len(setup.model[0].blocks)
    else:
        if not isinstance(model, GPT) or model.cfg.tie_weights:
            raise HarnessError("pipeline: needs the gpt workload built with tie_weights = false, "
                               "or an hf: decoder")
        per = len(model.blocks) // total
        criterion = model.criterion  # the model's own: a kernel may have replaced it

        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return criterion(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

        modules = [GPTStage(model, range(s * per, (s + 1) * per), s == 0, s == total - 1)
                   for s in ids]
        if getattr(criterion, "fuses_head", False):  # fused linear_cross_entropy
            loss_fn = fused_head_loss_fn(modules, criterion) or loss_fn
        setup.model = Stages(modules, ids, total, loss_fn)
    setup.notes.append(
        f"pipeline: stages {ids} of {total} on pipeline rank {rank}, {per} blocks each"
    )


def build_schedule(setup, settings) -> None:
    """Wrap the (maybe FSDP-wrapped) stage modules and install the step."""
    from torch.distributed import pipelining

    stages: Stages = setup.model
    pp = group(setup.mesh, "pipeline", "pipeline")
    pipe = [
        pipelining.PipelineStage(module, s, stages.total, setup.device, group=pp)
        for module, s in zip(stages, stages.ids, strict=True)
    ]
    n = setup.accumulation_steps
    kind = getattr(pipelining, SCHEDULES[settings.schedule])
    # Multi-stage schedules take this rank's list of stages; the others its one stage.
    schedule = kind(pipe if settings.virtual_stages > 1 else pipe[0], n, loss_fn=stages.loss_fn)
    first = any(s.is_first for s in pipe)
    last = any(s.is_last for s in pipe)

    def step(setup, micro_batches, _loss_fn):
        idx = torch.cat([mb[0] for mb in micro_batches])
        targets = torch.cat([mb[1] for mb in micro_batches])
        losses: list[torch.Tensor] = []
        with setup.autocast():
            # return_outputs=False: the losses are all we read; keeping every
            # micro-batch's logits (and a merged copy) would only cost memory.
            schedule.step(*([idx] if first else []), target=targets if last else None,
                          losses=losses if last else None, return_outputs=False)
        setup.optimizer.step()
        setup.optimizer.zero_grad(set_to_none=True)
        return torch.stack(losses).detach().float().mean() if last else None

    setup.step_override = step
    setup.notes.append(f"pipeline: schedule {settings.schedule}, {n} micro-batches")


register(Pipeline())
