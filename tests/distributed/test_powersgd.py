"""ddp compression = "powersgd" (the seed's communication warm-up) on 2 gloo ranks.

One torchrun launch of this file (its own free port, a timeout) runs the cases below on
both ranks through `compose` (strategies.ddp's hook, torch's powerSGD_hook); each rank
writes its figures to OUT/rank{r}.json and the tests read them. The model is a small
MLP (Linear 16->32, tanh, Linear 32->8), one DDP bucket; its weights stay fixed while
each step's batch changes, so every step's reference is the exact mean gradient: the
same model's gradient of the whole global batch in one process.

  - warm-up: the first `start_powersgd_iter` steps' gradients are the plain all-reduce's
    (within 1e-6: only the summation order differs);
  - after it, rank 1: each weight's gradient is a rank-1 matrix P Q^T that differs from
    the exact mean (relative error above 1e-2); on the first compressed step it is a
    projection of the exact mean onto one direction: its error is at least the best
    rank-1 error (Eckart-Young) and at most the gradient's norm; biases (1-D) stay exact;
  - rank 2 with one sample per rank: the mean gradient has rank <= 2, so rank-2 PowerSGD
    reproduces it while sending the factors only: within 1e-3 of its norm (observed 1e-7,
    2e-6, 8e-5 on the three compressed steps: torch's error feedback keeps each rank's
    deviation from the mean, which grows step by step, and the fp32 rounding with it);
  - the effect: the elements each step passes to dist.all_reduce are the whole gradients
    (808) in the warm-up, then (n + m) r per weight matrix plus the biases: 88 r + 40;
  - training: 30 AdamW steps, the loss equal to plain DDP's through the warm-up (1e-6)
    and, compressed, still falling (below half the first step's);
  - one process on the global batch, through the hook in a group of its own (as the run
    to a target loss trains it): the two ranks' gradients at every step (1e-5 of the
    norm), compressed ones included; the hook's state keeps the bytes the estimator
    counts (error feedback the gradients' size, and the factors).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RANKS = 2
TIMEOUT_S = 300  # a hang guard on a loaded 2-core machine, not a speed claim
SHAPES = {"0.weight": (32, 16), "0.bias": (32,), "2.weight": (8, 32), "2.bias": (8,)}
START = 3  # steps of plain all-reduce
STEPS = 6
TRAIN_STEPS = 30


def sent_elements(rank: int) -> int:
    """What the estimator says torch's hook all-reduces per step after the warm-up:
    (n + m) r per weight (each passes torch's 2x min_compression_rate test here), the
    biases whole."""
    from training_harness.estimator.compression import powersgd_elements

    return sum(powersgd_elements(s, rank)[0] for s in SHAPES.values())


# ---- the ranks' side ---------------------------------------------------------------

def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))


def _global_batch(step: int, n: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(RANKS * n, 16, generator=g), torch.randn(RANKS * n, 8, generator=g)


def _setup(ddp: dict, per_rank: int, lr: float = 1e-2):
    from training_harness.core.plan import Layout, Plan
    from training_harness.strategies.compose import compose

    plan = Plan(layout=Layout(data=RANKS), micro_batch_size=per_rank,
                global_batch_size=RANKS * per_rank, strategies={"ddp": ddp}, device="cpu",
                warmup_steps=0, steps=STEPS)
    plan.optimizer.lr = lr
    return compose(_model(), plan, "cpu")


def _loss(model, batch):
    import torch.nn.functional as F

    x, y = batch
    return F.mse_loss(model(x), y)


def gradient_case(rank: int, ddp: dict, per_rank: int) -> list[dict]:
    """Per step: each parameter's gradient after DDP's hook against the exact mean, and
    the elements handed to dist.all_reduce."""
    import torch
    import torch.distributed as dist

    setup = _setup(ddp, per_rank)
    plain = _model()
    sent: list[int] = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):  # the hook's collectives, by size
        sent.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counting
    steps = []
    try:
        for step in range(STEPS):
            x, y = _global_batch(step, per_rank)
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            sent.clear()
            _loss(setup.model, (x[mine], y[mine])).backward()
            plain.zero_grad()
            _loss(plain, (x, y)).backward()
            exact = dict(plain.named_parameters())
            record = {"sent": sum(sent), "params": {}, "grads": {}}
            for name, p in setup.model.module.named_parameters():
                got, want = p.grad.detach().clone(), exact[name].grad.detach()
                record["grads"][name] = got.flatten().tolist()
                sv = torch.linalg.svdvals(want) if want.dim() == 2 else None
                got_sv = torch.linalg.svdvals(got) if got.dim() == 2 else None
                record["params"][name] = {
                    "max_abs": (got - want).abs().max().item(),
                    "relative": ((got - want).norm() / want.norm()).item(),
                    "error": (got - want).norm().item(),
                    "norm": want.norm().item(),
                    # the best error of a rank-1 approximation (Eckart-Young)
                    "best_rank1_error": None if sv is None else sv[1:].norm().item(),
                    "got_rank": None if got_sv is None else int(
                        (got_sv > 1e-5 * got_sv[0]).sum().item()),
                }
            steps.append(record)
            setup.optimizer.zero_grad(set_to_none=True)
    finally:
        dist.all_reduce = real
    return steps


def one_process_case(ddp: dict, per_rank: int) -> list[dict]:
    """The same steps in one process on the whole global batch, through the hook in a
    process group of this process alone (strategies.ddp.alone, as the run to a target
    loss does): each step's gradients."""
    import torch

    from training_harness.strategies.ddp import DDP, alone, wrap_ddp
    from training_harness.strategies.setup import Setup

    settings = DDP.parse(ddp)
    steps = []
    with alone(torch.device("cpu")) as pg:
        setup = Setup(model=_model(), device=torch.device("cpu"))
        state = wrap_ddp(setup, "test", settings.bucket_cap_mb, "powersgd",
                         settings.gradient_as_bucket_view, settings, pg=pg)
        for step in range(STEPS):
            _loss(setup.model, _global_batch(step, per_rank)).backward()
            steps.append({name: p.grad.flatten().tolist()
                          for name, p in setup.model.module.named_parameters()})
            setup.model.zero_grad(set_to_none=True)
    # what the hook's state keeps between steps (its error-feedback, P and Q tensors)
    kept = sum(t.numel() * t.element_size() for held in
               (state.error_dict, state.p_memory_dict, state.q_memory_dict)
               for t in held.values())
    return {"steps": steps, "kept_bytes": kept}


def training_case(ddp: dict) -> list[float]:
    """The job's loss (mean over ranks) of TRAIN_STEPS AdamW steps on fixed data."""
    import torch
    import torch.distributed as dist

    setup = _setup(ddp, per_rank=8)
    x, y = _global_batch(0, 8)
    rank = dist.get_rank()
    mine = (x[rank * 8:(rank + 1) * 8], y[rank * 8:(rank + 1) * 8])
    losses = []
    for _ in range(TRAIN_STEPS):
        loss = setup.step([mine], _loss).detach()
        dist.all_reduce(loss)
        losses.append(loss.item() / RANKS)
    torch.manual_seed(0)
    return losses


POWERSGD = {"compression": "powersgd", "start_powersgd_iter": START}


def main(out: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record = {
        "rank1": gradient_case(rank, {**POWERSGD, "powersgd_rank": 1}, per_rank=4),
        "rank2-one-sample": gradient_case(rank, {**POWERSGD, "powersgd_rank": 2}, per_rank=1),
        "rank1-one-process": one_process_case({**POWERSGD, "powersgd_rank": 1}, per_rank=4),
        "train-plain": training_case({}),
        "train-powersgd": training_case({**POWERSGD, "powersgd_rank": 1}),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


# ---- the tests' side ---------------------------------------------------------------

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict[int, dict]:
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("needs torch.distributed (gloo)")
    from training_harness.core.ports import free_port

    out = tmp_path_factory.mktemp("powersgd")
    cmd = [sys.executable, "-m", "training_harness.launch.torchrun_agent",
           f"--nproc-per-node={RANKS}", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(Path(__file__)), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"no result within {TIMEOUT_S}s\n{(e.stderr or '')[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"torchrun exited {proc.returncode}\n{proc.stderr[-6000:]}")
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)}


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_the_warm_up_is_plain_all_reduce(ranks):
    for r in range(RANKS):
        for case in ("rank1", "rank2-one-sample"):
            for step in ranks[r][case][:START]:
                assert step["sent"] == sum(
                    n for s in SHAPES.values() for n in [s[0] * (s[1] if len(s) == 2 else 1)])
                for name, p in step["params"].items():
                    assert p["max_abs"] <= 1e-6, (r, case, name, p)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_after_the_warm_up_rank_1_sends_factors_and_approximates(ranks):
    for r in range(RANKS):
        steps = ranks[r]["rank1"][START:]
        assert [s["sent"] for s in steps] == [sent_elements(1)] * len(steps) == [128] * 3
        for i, step in enumerate(steps):
            for name, p in step["params"].items():
                if len(SHAPES[name]) == 1:  # all-reduced whole (error feedback cancels)
                    assert p["max_abs"] <= 1e-5, (r, i, name, p)
                    continue
                assert p["got_rank"] == 1, (r, i, name, p)
                assert p["relative"] > 1e-2, (r, i, name, p)
                if i == 0:  # no error fed back yet: a projection of the exact mean
                    assert p["best_rank1_error"] * (1 - 1e-4) <= p["error"], (name, p)
                    assert p["error"] <= p["norm"] * (1 + 1e-4), (name, p)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_low_rank_gradient_goes_through_exactly(ranks):
    for r in range(RANKS):
        steps = ranks[r]["rank2-one-sample"][START:]
        assert [s["sent"] for s in steps] == [sent_elements(2)] * len(steps) == [216] * 3
        for step in steps:
            for name, p in step["params"].items():
                assert p["relative"] <= 1e-3, (r, name, p)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_one_process_on_the_global_batch_computes_what_the_ranks_do(ranks):
    """The run to a target loss trains PowerSGD in one process (strategies.ddp.alone):
    its gradients are the two ranks', through the warm-up and compressed."""
    import torch

    for r in range(RANKS):
        one_process = ranks[r]["rank1-one-process"]["steps"]
        for step, (two, one) in enumerate(zip(ranks[r]["rank1"], one_process, strict=True)):
            for name, want in two["grads"].items():
                a, b = torch.tensor(one[name]), torch.tensor(want)
                assert (a - b).norm() <= 1e-5 * b.norm(), (r, step, name)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_the_estimator_counts_what_the_hook_keeps(ranks):
    """Error feedback the gradients' size, and the rank-1 factors of both weights."""
    from training_harness.estimator.compression import powersgd_kept
    from training_harness.estimator.facts import Param
    from training_harness.estimator.settings import Parallelism

    params = [Param(name, shape, 4, True, None, True) for name, shape in SHAPES.items()]
    want = powersgd_kept(params, Parallelism(data=2, ddp=True, compression="powersgd"))
    assert want == 4 * (808 + 48 + 40)
    assert ranks[0]["rank1-one-process"]["kept_bytes"] == want


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_training_follows_plain_ddp_through_the_warm_up_then_keeps_falling(ranks):
    plain, compressed = ranks[0]["train-plain"], ranks[0]["train-powersgd"]
    assert ranks[1]["train-powersgd"] == compressed  # the job's loss, the same on both
    # step k's loss is before its update: the first START + 1 see only plain updates
    for a, b in zip(plain[:START + 1], compressed[:START + 1], strict=True):
        assert abs(a - b) <= 1e-6
    assert compressed[START + 1] != plain[START + 1]
    assert compressed[-1] < 0.5 * compressed[0], compressed


if __name__ == "__main__":
    import gc
    import warnings

    warnings.filterwarnings("ignore")
    gc.disable()  # a short-lived rank (tests/distributed/run_case.py says why)
    main(Path(sys.argv[1]))
