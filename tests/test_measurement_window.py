"""The measured steps as one window: one synchronisation (and barrier) at each end and none
per step, throughput from the window, the losses read and agreed once after it.

Nothing here asserts how fast anything ran: only which calls happened, in what order,
and that the record's figures follow from the times it holds.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.tiny import TINY_GPT
from training_harness.core.plan import Plan
from training_harness.measure import distributed, timing, trial_loop
from training_harness.measure.prepare import prepare
from training_harness.measure.rank_process import RankInfo
from training_harness.measure.ranks import StepLoss, agree_losses, combine, loss_rows, read_losses
from training_harness.measure.trial_loop import measure, run_trial
from training_harness.records.step_log import STEP_LOG_ENV, read_steps

# A fixed peak, so that preparing the plan calibrates nothing.
PEAK = {
    "dtype": "fp32",
    "datasheet": None,
    "measured": {"flops": 1e12, "source": "test: a fixed figure"},
    "used": "measured",
    "reason": "test",
}


def prepared(device: str = "cpu", warmup: int = 1, steps: int = 4,
             warmup_max_steps: int | None = None, min_window_s: float | None = None, **faults):
    """A tiny GPT (tests.faulty_workload: `nan_at_step` counts warm-up steps too)."""
    plan = Plan(
        name="window",
        workload="tests.faulty_workload:build",
        workload_args={**TINY_GPT, **faults},
        device=device,
        micro_batch_size=4,
        warmup_steps=warmup,
        steps=steps,
        warmup_max_steps=warmup_max_steps,
        min_window_s=min_window_s,
    )
    return prepare(plan, peaks={"fp32": PEAK, "tf32": {**PEAK, "dtype": "tf32"}})


def traced(monkeypatch, prep) -> list[str]:
    """The loop's synchronisations, barriers, loss reads and training steps, in order;
    each still does what it did (so CUDA events can be read after the window)."""
    log: list[str] = []
    real_sync, real_step_loss, real_read = timing.synchronize, trial_loop.step_loss, read_losses

    def sync(device):
        log.append("sync")
        real_sync(device)

    def step_loss(*args):
        log.append("read")
        return real_step_loss(*args)

    def read_all(losses, *args):
        log.append(f"read {len(losses)}")
        return real_read(losses, *args)

    inner = prep.workload.loss

    def loss(model, batch):
        log.append("step")
        return inner(model, batch)

    monkeypatch.setattr(timing, "synchronize", sync)
    monkeypatch.setattr(distributed, "barrier", lambda: log.append("barrier"))
    monkeypatch.setattr(trial_loop, "step_loss", step_loss)
    monkeypatch.setattr(trial_loop, "read_losses", read_all)
    prep.workload.loss = loss
    return log


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_window_synchronises_once_at_each_end_and_never_per_step(monkeypatch, tmp_path, device):
    # The plan's own window rule: on CUDA the default warms up until settled and
    # stretches the window to 2 s (training_harness.core.window), which would change the counts.
    prep = prepared(device, warmup=2, steps=5, warmup_max_steps=2, min_window_s=0.0)
    log = traced(monkeypatch, prep)
    progress = tmp_path / "steps.log"
    monkeypatch.setenv(STEP_LOG_ENV, str(progress))
    metrics, status, reason = measure(prep)
    assert (status, reason) == ("ok", None)
    # Warm-up reads each loss at once; the window reads its five after its end.
    assert log == [
        *["step", "read"] * 2,
        "barrier",
        "sync",
        *["step"] * 5,
        "sync",
        "barrier",
        "read 5",
    ]
    source = "CUDA events" if device == "cuda" else "perf_counter"
    assert metrics["window"]["source"] == source and metrics["window"]["steps"] == 5
    # The tuner's progress: every measured step, numbered after the warm-up, with the
    # record's own per-step times (one process: the job's times are this rank's).
    lines = progress.read_text().splitlines()
    assert [int(line.split()[0]) for line in lines] == [2, 3, 4, 5, 6]
    assert read_steps(progress) == metrics["step_times_s"]
    assert len(metrics["loss"]["values"]) == 7 and metrics["loss"]["finite"] is True


def test_throughput_comes_from_the_window_and_the_spread_from_the_steps():
    prep = prepared(warmup=1, steps=6)
    metrics, status, _ = measure(prep)
    assert status == "ok"
    window, plan = metrics["window"], prep.plan
    assert window["steps"] == 6 and window["seconds"] > 0
    assert metrics["samples_per_s"] == pytest.approx(plan.batch_size * 6 / window["seconds"])
    assert window["samples_per_s"] == metrics["samples_per_s"]
    assert metrics["tokens_per_s"] == pytest.approx(metrics["samples_per_s"] * TINY_GPT["seq_len"])
    step_s = window["seconds"] / 6
    tflops = metrics["flops_per_step"] / step_s / plan.world_size / 1e12
    assert metrics["tflops_per_device"] == pytest.approx(tflops)
    assert metrics["mfu"] == pytest.approx(tflops * 1e12 / PEAK["measured"]["flops"])
    assert metrics["mfu_measured_peak"] == pytest.approx(metrics["mfu"])
    # The per-step figures are still there, and the window is the steps end to end.
    times = metrics["step_times_s"]
    assert len(times) == 6 and all(t > 0 for t in times)
    assert set(metrics["step_time_s"]) >= {"median", "p10", "p90", "n", "mean", "stdev"}
    assert metrics["step_time_s"]["n"] == 6
    assert metrics["step_time_s"]["min"] <= metrics["step_time_s"]["median"]
    assert window["seconds"] == pytest.approx(sum(times), rel=1e-9)
    assert metrics["per_rank"][0]["window_s"] == window["seconds"]


def test_a_nan_inside_the_window_is_diverged_at_the_first_bad_step():
    prep = prepared(warmup=1, steps=5, nan_at_step=2)
    result = run_trial(prep, "test")
    assert result.status == "diverged"
    assert result.reason == "loss became nan at step 2"
    loss = result.metrics["loss"]
    assert len(loss["values"]) == 3 and loss["finite"] is False and math.isnan(loss["values"][2])
    assert math.isfinite(loss["values"][1])
    assert math.isnan(result.metrics["per_rank"][0]["loss_last"])
    # The window ran to its end: its steps were timed all the same.
    assert len(result.metrics["step_times_s"]) == 5
    assert result.metrics["window"]["steps"] == 5


def test_a_nan_in_warm_up_stops_there_before_any_window(monkeypatch):
    prep = prepared(warmup=3, steps=5, nan_at_step=1)
    log = traced(monkeypatch, prep)
    metrics, status, reason = measure(prep)
    assert (status, reason) == ("diverged", "loss became nan at step 1")
    assert log == ["step", "read", "step", "read"]  # no third step, no window
    assert len(metrics["loss"]["values"]) == 2
    assert metrics["step_time_s"]["n"] == 0 and "window" not in metrics


# --- the deferred reduction against the per-step one it replaces ------------------------


def old_step_loss(losses: list[float | None], rank: int) -> StepLoss:
    """The per-step function as it was (training_harness.measure.ranks.step_loss before the window),
    with its all-reduce done here: `losses` holds every rank's loss of one step."""
    world = len(losses)
    mine = losses[rank]
    if world == 1:
        local = mine
        bad = [] if local is None or math.isfinite(local) else [rank]
        return StepLoss(local, local, bad)
    total = torch.zeros(world + 2, dtype=torch.float64)
    for r, v in enumerate(losses):  # each rank's tensor, summed as the all-reduce did
        t = torch.zeros(world + 2, dtype=torch.float64)
        if v is not None:
            x = torch.tensor(v, dtype=torch.float32).to(torch.float64).reshape(())
            finite = torch.isfinite(x)
            t[r] = (~finite).to(torch.float64)
            t[-2] = torch.where(finite, x, torch.zeros_like(x))
            t[-1] = 1.0
        total += t
    values = total.tolist()
    local = None if mine is None else torch.tensor(mine, dtype=torch.float32).item()
    bad = [r for r in range(world) if values[r] > 0]
    if bad:
        value = math.nan
    elif values[-1] > 0:
        value = values[-2] / values[-1]
    else:
        value = None
    return StepLoss(value, local, bad)


def same(a: StepLoss, b: StepLoss) -> bool:
    return repr(a) == repr(b)  # nan == nan in their repr


NAN, INF = math.nan, math.inf
# steps x ranks: each rank's loss at each step (None: a pipeline's earlier stage)
CASES = {
    "two ranks": [[2.0, 4.0], [1.25, 0.5]],
    "a pipeline: only the last stage has a loss": [[None, 5.0], [None, 2.5]],
    "nan on one rank, then fine": [[1.0, 3.0], [NAN, 1.0], [1.0, 1.0]],
    "inf and nan": [[INF, NAN]],
    "no rank has a loss": [[None, None]],
    "three ranks, one without a loss, one bad": [[None, 2.0, 3.0], [None, INF, 1.0]],
    "one process": [[2.5], [NAN], [None], [INF]],
}


@pytest.mark.parametrize("steps", CASES.values(), ids=list(CASES))
def test_the_deferred_reduction_agrees_with_the_per_step_one(steps):
    world = len(steps[0])
    as_float32 = [[None if v is None else torch.tensor(v).item() for v in s] for s in steps]
    # Every rank's share of the table, summed over ranks as the one all-reduce does.
    shares = [loss_rows([s[r] for s in as_float32], r, world) for r in range(world)]
    summed = [[sum(col) for col in zip(*rows, strict=True)] for rows in zip(*shares, strict=True)]
    for r in range(world):
        local = [s[r] for s in as_float32]
        new = agree_losses(local, summed if world > 1 else None, r)
        old = [old_step_loss(s, r) for s in steps]
        assert all(same(a, b) for a, b in zip(new, old, strict=True)), (r, new, old)


def test_read_losses_does_one_all_reduce_for_the_whole_window(monkeypatch):
    """Rank 1 of 2, the other rank's share added by a stand-in for the all-reduce."""
    steps = CASES["nan on one rank, then fine"] + CASES["two ranks"]
    other = loss_rows([s[0] for s in steps], 0, 2)
    calls = []

    def all_sum(t: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(t.shape))
        t += torch.tensor(other, dtype=torch.float64)
        return t

    monkeypatch.setattr(distributed, "all_sum", all_sum)
    mine = [None if s[1] is None else torch.tensor(s[1]) for s in steps]
    agreed = read_losses(mine, RankInfo(rank=1, world_size=2), torch.device("cpu"))
    assert calls == [(len(steps), 4)]
    assert [repr(a) for a in agreed] == [repr(old_step_loss(s, 1)) for s in steps]
    assert agreed[1].bad_ranks == [0] and math.isnan(agreed[1].value)
    assert read_losses([], RankInfo(rank=1, world_size=2), torch.device("cpu")) == []
    assert calls == [(len(steps), 4)]  # nothing to agree on: no collective


def test_combine_takes_the_slowest_ranks_window():
    def figures(rank, times, window):
        memory = {"rss": 1}
        return {
            "rank": rank,
            "step_times_s": times,
            "window_s": window,
            "peak_memory_bytes": 1,
            "memory": memory,
        }

    job = combine([figures(0, [1.0, 2.0], 2.9), figures(1, [1.5, 1.0], 2.4)])
    assert job["window_s"] == 2.9 and job["step_times_s"] == [1.5, 2.0]
    assert [r["window_s"] for r in job["per_rank"]] == [2.9, 2.4]
    assert combine([figures(0, [], None)])["window_s"] is None
