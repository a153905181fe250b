"""What 2 gloo ranks really hold, for the estimator's tests (one torchrun launch).

    python -m torch.distributed.run --nproc-per-node 2 tests/estimator/run_ranks.py OUT

Every case composes its strategies on a small untied GPT over the same 2 ranks
(data, pipeline or tensor parallel: each layout its own mesh), runs one step,
then measures a second: the bytes of parameters, gradients (at the optimizer
step) and optimizer state the rank holds (local shards, as
tests/distributed/run_case.py counts them), and the peak of the tensors created
or written during the step that are alive together (`LiveBytes`), parameters and
optimizer state aside. Each rank writes OUT/rank{r}.json: {case: record}.

(The tests run these cases as tests/distributed/run_case.py's family "estimator", in the
launch of the other 2-rank cases: one interpreter per rank, torch imported once.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GPT = dict(layers=4, heads=4, hidden=64, seq_len=64, vocab=256, tie_weights=False)
# name: (layout, strategies, micro-batch, global batch)
CASES = {
    "ddp": ({"data": 2}, {"ddp": {}}, 4, 8),
    "zero1": ({"data": 2}, {"zero": {"stage": 1}}, 4, 8),
    "zero2": ({"data": 2}, {"zero": {"stage": 2}}, 4, 8),
    "zero3": ({"data": 2}, {"zero": {"stage": 3}}, 4, 8),
    "zero2-bf16": ({"data": 2}, {"zero": {"stage": 2}, "amp": {"dtype": "bf16"}}, 4, 8),
    "pipeline-1f1b": ({"pipeline": 2}, {"pipeline": {"schedule": "1f1b"}}, 2, 8),
    "pipeline-gpipe": ({"pipeline": 2}, {"pipeline": {"schedule": "gpipe"}}, 2, 8),
    "pipeline-interleaved": (
        {"pipeline": 2}, {"pipeline": {"schedule": "interleaved-1f1b", "virtual_stages": 2}}, 2, 8
    ),
    "tensor": ({"tensor": 2}, {"tensor": {}}, 4, 4),
}


def plan_of(case: str):
    from training_harness.core.plan import Layout, Plan

    layout, strategies, micro, global_batch = CASES[case]
    return Plan(workload="gpt", workload_args=GPT, layout=Layout(**layout),
                micro_batch_size=micro, global_batch_size=global_batch,
                strategies=strategies, device="cpu", warmup_steps=0, steps=2)


def live_bytes_mode(exclude: set[int]):
    """A dispatch mode keeping the peak of the storages ops return (created or
    written inside it, `exclude` aside) that are alive together, at their current
    size (FSDP frees gathered parameters by resizing their storage to 0)."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, StorageWeakRef] = {}
            self.peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                t = getattr(t, "_local_tensor", t)  # a DTensor's shard
                try:
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                except (RuntimeError, NotImplementedError):
                    continue
                if key and key not in self.live and key not in exclude:
                    self.live[key] = StorageWeakRef(storage)
            self.live = {k: ref for k, ref in self.live.items() if not ref.expired()}
            now = sum(torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()
                      for ref in self.live.values())
            self.peak = max(self.peak, now)
            return out

    return LiveBytes()


def run(case: str, rank: int) -> dict:
    import torch

    from tests.distributed.run_case import local_bytes, optimizer_state_bytes
    from training_harness.measure.batches import step_pool
    from training_harness.strategies.compose import compose
    from training_harness.workloads import load_workload

    plan = plan_of(case)
    workload = load_workload("gpt", GPT)
    torch.manual_seed(0)
    setup = compose(workload.build_model(), plan, "cpu")
    grads: list[int] = []
    setup.optimizer.register_step_pre_hook(lambda *_: grads.append(sum(
        local_bytes(p.grad) for p in setup.model.parameters() if p.grad is not None
    )))
    pool = step_pool(plan, workload, torch.device("cpu"), plan.layout.coordinates(rank)[1])
    setup.step(pool[0], workload.loss)
    optimizer = getattr(setup.optimizer, "optim", setup.optimizer)
    kept = [*setup.model.parameters(),
            *(t for state in optimizer.state.values() for t in state.values()
              if isinstance(t, torch.Tensor))]
    exclude = {getattr(t, "_local_tensor", t).untyped_storage().data_ptr() for t in kept}
    with live_bytes_mode(exclude) as live:
        setup.step(pool[1], workload.loss)
    return {
        "param_bytes": sum(local_bytes(p) for p in setup.model.parameters()),
        "grad_bytes": grads[-1],
        "optimizer_state_bytes": optimizer_state_bytes(setup.optimizer),
        "step_peak_bytes": live.peak,
    }


def run_all(rank: int, only: set[str]) -> dict:
    """Every case (those named in `only`, where it names some) on this rank, by name."""
    import torch.distributed as dist

    results = {}
    for case in CASES:
        if not only or case in only:
            results[case] = run(case, rank)
            dist.barrier()
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
