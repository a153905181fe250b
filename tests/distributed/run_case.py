"""Run families of parallel cases on the ranks of one torchrun launch (CPU, gloo).

    python -m torch.distributed.run --nproc-per-node 2 tests/distributed/run_case.py \
        FAMILY[,FAMILY...] OUT

Every case composes its strategies on the tiny GPT of tests/tiny.py, trains a few
steps on this rank's share of the same global batches as the single-process
run (training_harness.measure.batches.step_pool), and records per rank: the losses, and the
bytes of optimizer state, gradients and parameters this rank holds (local
shards of DTensors). The family "hf" is tests/workloads/run_hf_case.py's cases (each
with its own layout of 2 ranks), the family "estimator" tests/estimator/run_ranks.py's
(their names prefixed "estimator:"). Each rank writes OUT/rank{r}.json: {case: record}.

`launch_families` (the tests' side) runs the families on the same number of ranks in
one launch: the interpreters, torch's import and the gloo group are paid once, and
case names are unique across families.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STEPS = 5
LR = 1e-2


@dataclass
class Case:
    name: str
    strategies: dict
    micro: int = 4
    global_batch: int = 8
    gpt: dict = field(default_factory=dict)  # overrides of tests.tiny.TINY_GPT
    pretend_cuda: bool = False  # pass the checks of CUDA-only settings (fp16) on the CPU
    count_allreduce: bool = False  # count DDP's bucket all-reduces


UNTIED = {"tie_weights": False}
LINEAR_CE = {"linear_cross_entropy": True}  # fused linear cross-entropy, the rest default
FAMILIES: dict[str, tuple[dict, list[Case]]] = {
    "data": ({"data": 2}, [
        Case("ddp", {"ddp": {}}),
        Case("ddp-accumulation", {"ddp": {}, "accumulation": {}}, micro=2, count_allreduce=True),
        Case("ddp-accumulation-sync-every", {"ddp": {}, "accumulation": {"sync_last_only": False}},
             micro=2, count_allreduce=True),
        Case("ddp-fp16-compression", {"ddp": {"compression": "fp16", "bucket_cap_mb": 0.01}}),
        Case("zero1", {"zero": {"stage": 1}}),
        Case("zero2", {"zero": {"stage": 2}}),
        Case("zero3", {"zero": {"stage": 3}}),
        Case("zero3-offload", {"zero": {"stage": 3, "offload": True}}),
        Case("zero1-accumulation", {"zero": {"stage": 1}, "accumulation": {}}, micro=2),
        Case("zero2-accumulation", {"zero": {"stage": 2}, "accumulation": {}}, micro=2),
        Case("zero3-accumulation", {"zero": {"stage": 3}, "accumulation": {}}, micro=2),
        Case("zero3-checkpoint", {"zero": {"stage": 3}, "checkpoint": {}}),
        Case("zero2-bf16", {"zero": {"stage": 2}, "amp": {"dtype": "bf16"}}),
        Case("zero3-fp16", {"zero": {"stage": 3}, "amp": {"dtype": "fp16"}}, pretend_cuda=True),
        # the fused linear cross-entropy inside FSDP's root (the head's gathered weight)
        Case("zero3-linear-ce", {"zero": {"stage": 3}, "fused": LINEAR_CE}),
        Case("ddp-linear-ce", {"ddp": {}, "fused": LINEAR_CE}),
    ]),
    "pipeline": ({"pipeline": 2}, [
        Case("pipeline-gpipe", {"pipeline": {"schedule": "gpipe"}}, micro=2, gpt=UNTIED),
        Case("pipeline-1f1b", {"pipeline": {"schedule": "1f1b"}}, micro=2, gpt=UNTIED),
        Case("pipeline-interleaved", {"pipeline": {"schedule": "interleaved-1f1b",
                                                   "virtual_stages": 2}},
             micro=2, gpt={**UNTIED, "layers": 4}),
        Case("pipeline-1f1b-checkpoint", {"pipeline": {}, "checkpoint": {}}, micro=2, gpt=UNTIED),
        # the last stage hands on ln_f's output; the schedule's loss fuses the head
        Case("pipeline-1f1b-linear-ce", {"pipeline": {}, "fused": LINEAR_CE}, micro=2,
             gpt=UNTIED),
    ]),
    "tensor": ({"tensor": 2}, [
        Case("tensor", {"tensor": {}}, micro=8),
        Case("tensor-attention-only", {"tensor": {"mlp": False}}, micro=8),
        Case("tensor-accumulation", {"tensor": {}, "accumulation": {}}, micro=4),
        Case("tensor-sdpa-foreach", {"tensor": {}, "fused": {"attention": "sdpa",
                                                             "optimizer": "foreach"}}, micro=8),
        Case("tensor-fused-adamw", {"tensor": {}, "fused": {"optimizer": "fused"}}, micro=8),
        Case("tensor-linear-ce", {"tensor": {}, "fused": LINEAR_CE}, micro=8),  # head replicated
    ]),
    # 4 ranks: the data-parallel wrappers on pipeline stages and on tensor shards.
    "pipeline-data": ({"pipeline": 2, "data": 2}, [
        Case("pipeline-zero2", {"pipeline": {}, "zero": {"stage": 2}}, micro=2, gpt=UNTIED),
        Case("pipeline-zero3", {"pipeline": {}, "zero": {"stage": 3}}, micro=2, gpt=UNTIED),
        Case("pipeline-zero3-linear-ce", {"pipeline": {}, "zero": {"stage": 3},
                                          "fused": LINEAR_CE}, micro=2, gpt=UNTIED),
    ]),
    "tensor-data": ({"tensor": 2, "data": 2}, [
        Case("tensor-zero2", {"tensor": {}, "zero": {"stage": 2}}),
        Case("tensor-zero3", {"tensor": {}, "zero": {"stage": 3}, "accumulation": {}}, micro=2),
    ]),
}


def local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def optimizer_state_bytes(opt) -> int:
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    return sum(
        local_bytes(v) for state in inner.state.values() for v in state.values()
        if hasattr(v, "numel")
    )


def run(case: Case, layout: dict, rank: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from tests.tiny import TINY_GPT, tiny_gpt
    from training_harness.core.device import RuntimeEnv
    from training_harness.core.plan import Layout, Plan
    from training_harness.measure.batches import step_pool
    from training_harness.strategies.compose import compose

    workload = tiny_gpt(**case.gpt)
    torch.manual_seed(0)
    model = workload.build_model()
    plan = Plan(workload_args={**TINY_GPT, **case.gpt},
                layout=Layout(**layout), micro_batch_size=case.micro,
                global_batch_size=case.global_batch, strategies=case.strategies,
                device="cpu", warmup_steps=0, steps=STEPS)
    plan.optimizer.lr = LR
    env = None
    if case.pretend_cuda:
        env = RuntimeEnv("cuda", "pretend", 1, bf16=True, triton=False)
    setup = compose(model, plan, "cpu", env)

    allreduces = [0]
    if case.count_allreduce:
        pg = setup.mesh["data"].get_group()

        def counting(state, bucket):
            allreduces[0] += 1
            return default_hooks.allreduce_hook(pg, bucket)

        setup.model.register_comm_hook(None, counting)

    grad_bytes = []
    setup.optimizer.register_step_pre_hook(lambda *_: grad_bytes.append(sum(
        local_bytes(p.grad) for p in setup.model.parameters() if p.grad is not None
    )))
    data_rank = plan.layout.coordinates(rank)[1]
    pool = step_pool(plan, workload, torch.device("cpu"), data_rank)
    losses = []
    for s in range(STEPS):
        loss = setup.step(pool[s], workload.loss)
        losses.append(None if loss is None else loss.item())
    dist.barrier()
    return {
        "losses": losses,
        "optimizer_state_bytes": optimizer_state_bytes(setup.optimizer),
        "grad_bytes": max(grad_bytes) if grad_bytes else None,
        "param_bytes": sum(local_bytes(p) for p in setup.model.parameters()),
        "allreduces_per_step": allreduces[0] / STEPS,
        "grad_scaler": type(setup.grad_scaler).__name__ if setup.grad_scaler else None,
        "notes": setup.notes,
    }


HF = "hf"  # tests/workloads/run_hf_case.py's cases, on 2 ranks
ESTIMATOR = "estimator"  # tests/estimator/run_ranks.py's cases, on 2 ranks
# A launch of every family on 2 ranks, on a 2-core machine shared with other test runs
# (at a load of 10 one took 4 min): a hang guard, not a speed claim.
TIMEOUT_S = 600


def ranks(family: str) -> int:
    from training_harness.core.plan import Layout

    return 2 if family in (HF, ESTIMATOR) else Layout(**FAMILIES[family][0]).world_size


def same_ranks(family: str) -> tuple[str, ...]:
    """The families that run in one launch with `family`: those on as many ranks."""
    return tuple(f for f in [*FAMILIES, HF, ESTIMATOR] if ranks(f) == ranks(family))


def launch_families(families: tuple[str, ...], out: Path) -> dict[int, dict]:
    """Run `families` (all on the same number of ranks) in one torchrun launch on its
    own free port, under a timeout; each rank's records by rank."""
    import pytest

    from training_harness.core.ports import free_port

    n = ranks(families[0])
    cmd = [
        # torchrun, its imports with the collector paused
        sys.executable, "-m", "training_harness.launch.torchrun_agent", f"--nproc-per-node={n}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        str(Path(__file__)), ",".join(families), str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    what = ", ".join(families)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                              env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: no result within {TIMEOUT_S}s\n{(e.stderr or '')[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{what}: torchrun exited {proc.returncode}\n{proc.stderr[-6000:]}")
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(n)}


def main() -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    families, out = sys.argv[1].split(","), Path(sys.argv[2])
    only = set(sys.argv[3:])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict[str, dict] = {}
    for family in families:
        if family == HF:
            from tests.workloads import run_hf_case

            found = run_hf_case.run_all(rank, only)
        elif family == ESTIMATOR:
            from tests.estimator import run_ranks

            found = {f"{ESTIMATOR}:{case}": record
                     for case, record in run_ranks.run_all(rank, only).items()}
        else:
            layout, cases = FAMILIES[family]
            found = {c.name: run(c, layout, rank) for c in cases if not only or c.name in only}
        assert not found.keys() & results.keys(), f"{family}: a case name taken already"
        results |= found
    (out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    import gc

    # A short-lived rank: its imports (torch, transformers) and the tiny models' steps
    # run without the cyclic collector, whose sweeps of torch's heap are a third of the
    # imports' CPU (training_harness.core.paused_imports); what little cyclic garbage a case
    # leaves ends with the process.
    gc.disable()
    main()
