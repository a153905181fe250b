"""Run the hf: and torchvision: parallel cases on the ranks of one torchrun launch (CPU, gloo).

    python -m torch.distributed.run --nproc-per-node 2 tests/workloads/run_hf_case.py OUT

(The tests run these cases as tests/distributed/run_case.py's family "hf", in the launch
of the other 2-rank cases.)

Every case composes its strategies on a tiny hf: or torchvision: model
(tests/workloads/tiny_hf.py), with its own layout of the 2 ranks (data, tensor or
pipeline), trains 5 steps (resnet18 3) on this rank's share of the same global batches
of 8 as the single-process run, and records its losses. Each rank writes
OUT/rank{r}.json: {case: {"losses": [...], "notes": [...]}}.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEPS = 5
LR = 1e-2
VISION_LR = 1e-3
# resnet18 (11M parameters, 64 px) costs 3 to 10 times what a tiny hf: model's case does
# (and as much again for its one-process baseline): 3 steps, 2 updates checked (the second
# with Adam's moments of the first), where the others take 5.
VISION_STEPS = 3


@dataclass
class Case:
    name: str
    model: str  # a key of TINY_HF or TINY_VISION
    layout: dict
    strategies: dict
    micro: int = 4
    lr: float = LR
    steps: int = STEPS


DATA, TENSOR, PIPE = {"data": 2}, {"tensor": 2}, {"pipeline": 2}
CASES = [
    *[Case(f"{m}-{name}", m, DATA, plan) for m in ("llama", "gpt2", "bert")
      for name, plan in [("ddp", {"ddp": {}}), ("zero1", {"zero": {"stage": 1}}),
                         ("zero2", {"zero": {"stage": 2}}), ("zero3", {"zero": {"stage": 3}})]],
    Case("llama-zero3-checkpoint-accumulation", "llama", DATA,
         {"zero": {"stage": 3}, "checkpoint": {}, "accumulation": {}}, micro=2),
    Case("llama-tensor", "llama", TENSOR, {"tensor": {}}, micro=8),
    # A mixture of experts: every expert resident on each rank, routed per token.
    Case("mixtral-ddp", "mixtral", DATA, {"ddp": {}}),
    Case("mixtral-zero3-checkpoint", "mixtral", DATA, {"zero": {"stage": 3}, "checkpoint": {}}),
    # Its tensor plan splits the attention; the experts stay whole (transformers >= 5.25
    # puts them in an expert-parallel plan, not applied here).
    Case("mixtral-tensor", "mixtral", TENSOR, {"tensor": {}}, micro=8),
    # An encoder-decoder: FSDP2 and checkpointing on both stacks' T5Blocks.
    Case("t5-zero3-checkpoint", "t5", DATA, {"zero": {"stage": 3}, "checkpoint": {}}),
    Case("llama-tensor-attention-only-sdpa", "llama", TENSOR,
         {"tensor": {"mlp": False}, "fused": {"attention": "sdpa"}}, micro=8),
    Case("llama-pipeline-gpipe", "llama", PIPE, {"pipeline": {"schedule": "gpipe"}}, micro=2),
    Case("llama-pipeline-1f1b-sdpa", "llama", PIPE,
         {"pipeline": {"schedule": "1f1b"}, "fused": {"attention": "sdpa"}}, micro=2),
    # fused linear cross-entropy: inside FSDP's root forward (the head's hook), and as the
    # pipeline's loss on the last stage's normed output
    Case("llama-zero3-linear-ce", "llama", DATA,
         {"zero": {"stage": 3}, "fused": {"linear_cross_entropy": True}}),
    Case("llama-pipeline-1f1b-linear-ce", "llama", PIPE,
         {"pipeline": {}, "fused": {"linear_cross_entropy": True}}, micro=2),
    # No base_model_tp_plan: the harness's own plan (strategies.hf_tensor).
    *[Case(f"{m}-tensor", m, TENSOR, {"tensor": {}}, micro=8)
      for m in ("bert", "opt", "distilbert")],
    Case("opt-tensor-attention-only", "opt", TENSOR, {"tensor": {"mlp": False}}, micro=8),
    # BatchNorm normalises over each rank's 4 samples: the 1-process run accumulates 2 x 4.
    # lr 1e-3: at 1e-2 the loss jumps about, and the sum order's 1e-7 grows past 1e-2.
    *[Case(f"resnet18-{name}", "resnet18", DATA, plan, lr=VISION_LR, steps=VISION_STEPS)
      for name, plan in
      [("ddp", {"ddp": {}}), ("zero2", {"zero": {"stage": 2}}), ("zero3", {"zero": {"stage": 3}})]],
]

# LoRA beside DDP and ZeRO: tests/test_lora.py compares these with a one-process LoRA run
# (not with CASES' full fine-tuning baseline); skipped where peft is not installed.
LORA_CASES = [
    Case("llama-lora-ddp", "llama", DATA, {"lora": {}, "ddp": {}}),
    Case("llama-lora-zero1", "llama", DATA, {"lora": {}, "zero": {"stage": 1}}),
    Case("llama-lora-zero2-checkpoint", "llama", DATA,
         {"lora": {}, "zero": {"stage": 2}, "checkpoint": {}}),
    Case("llama-lora-zero3-checkpoint", "llama", DATA,
         {"lora": {}, "zero": {"stage": 3}, "checkpoint": {}}),
]


def _peft_missing() -> str | None:
    from training_harness.core.errors import HarnessError
    from training_harness.workloads import optional

    try:
        optional.require("peft", "peft")
    except HarnessError as e:
        return str(e)
    return None


def run(case: Case, rank: int) -> dict:
    import torch
    import torch.distributed as dist

    from tests.workloads.tiny_hf import workload_spec
    from training_harness.core.errors import HarnessError
    from training_harness.core.plan import Layout, Plan
    from training_harness.measure.batches import step_pool
    from training_harness.strategies.compose import compose
    from training_harness.workloads import load_workload

    name, args = workload_spec(case.model)
    try:
        workload = load_workload(name, args)
    except HarnessError as e:  # an extra (transformers, torchvision) not installed
        return {"skipped": str(e)}
    torch.manual_seed(0)
    model = workload.build_model()
    plan = Plan(workload=name, workload_args=args,
                layout=Layout(**case.layout), micro_batch_size=case.micro, global_batch_size=8,
                strategies=case.strategies, device="cpu", warmup_steps=0, steps=case.steps)
    plan.optimizer.lr = case.lr
    setup = compose(model, plan, "cpu")
    pool = step_pool(plan, workload, torch.device("cpu"), plan.layout.coordinates(rank)[1])
    losses = []
    for s in range(case.steps):
        loss = setup.step(pool[s], workload.loss)
        losses.append(None if loss is None else loss.item())
    dist.barrier()
    return {"losses": losses, "notes": setup.notes}


def run_all(rank: int, only: set[str]) -> dict:
    """Every case (those named in `only`, where it names some) on this rank, by name."""
    results = {c.name: run(c, rank) for c in CASES if not only or c.name in only}
    missing = _peft_missing()
    for c in LORA_CASES:
        if not only or c.name in only:
            results[c.name] = {"skipped": missing} if missing else run(c, rank)
    return results


def main() -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    out = Path(sys.argv[1])
    only = set(sys.argv[2:])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = run_all(rank, only)
    (out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
