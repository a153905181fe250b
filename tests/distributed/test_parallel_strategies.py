"""ddp, zero 1/2/3, pipeline and tensor parallel on 2 gloo ranks against one process.

The families of cases (tests/distributed/run_case.py) on 2 CPU ranks are one torchrun
launch, with tests/test_workloads_hf_parallel.py's and tests/estimator/'s cases, on its
own free port, under a timeout; the two 4-rank families that combine pipeline or tensor
with zero are another (marked slow); both run once per session (tests/conftest.py's
parallel_records). Every case trains the tiny GPT for 5 AdamW steps (lr 1e-2) on the
same global batches of 8 as the single-process run (tests/tiny.py). The job's loss of a
step is the mean over data ranks of the loss on the last pipeline stage (tensor rank 0).

Tolerances (absolute, on each step's loss, loss ≈ 4):
  - fp32 cases (ddp, zero 1/2/3, offload, accumulation, checkpoint, every pipeline
    schedule, tensor parallel, pipeline x zero, tensor x zero): 1e-4 - only the
    summation order differs (observed ≤ 7.2e-7)
  - ddp with fp16 gradient compression: 5e-3 (gradients rounded to 11 bits on
    the wire; observed ≤ 5e-4)
  - zero 2 with amp bf16 (FSDP mixed precision: bf16 compute, fp32 reduce): 2e-2,
    as for single-process bf16 (observed ≤ 1.9e-3)
  - zero 3 with amp fp16 and the sharded scaler: 1e-2 (observed ≤ 7e-4); fp16
    autocast on the CPU, past amp's CUDA-only check, to exercise the scaler
"""

from __future__ import annotations

import functools

import pytest
import torch.distributed as dist

from tests.distributed.run_case import FAMILIES, STEPS, TIMEOUT_S, ranks
from tests.tiny import tiny_gpt, train
from training_harness.core.plan import Layout

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed (gloo)"),
]

RANKS = 2
EXACT = 1e-4
TOLERANCE = {"ddp-fp16-compression": 5e-3, "zero2-bf16": 2e-2, "zero3-fp16": 1e-2}


@pytest.fixture
def results(parallel_records):
    """Records of a family, by rank (its launch runs once per session)."""
    return parallel_records


@functools.cache
def baseline(gpt: tuple) -> list[float]:
    """Single-process fp32 losses on the same global batches."""
    return train({}, micro=8, global_batch=8, steps=STEPS, workload=tiny_gpt(**dict(gpt)))


def job_losses(records: dict[int, dict], layout: Layout, case: str) -> list[float]:
    """Per step: the mean over data ranks of the last stage's loss (tensor rank 0)."""
    picked = [
        records[r][case]["losses"] for r in range(layout.world_size)
        if layout.coordinates(r)[0] == layout.pipeline - 1 and layout.coordinates(r)[2] == 0
    ]
    assert len(picked) == layout.data
    return [sum(step) / len(step) for step in zip(*picked, strict=True)]


CASES = [
    pytest.param(family, case, id=case.name,
                 marks=[pytest.mark.slow] if ranks(family) > RANKS else [])
    for family, (_, cases) in FAMILIES.items() for case in cases
]


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize(("family", "case"), CASES)
def test_loss_matches_single_process(results, family, case):
    layout = Layout(**FAMILIES[family][0])
    records = results(family)
    got = job_losses(records, layout, case.name)
    want = baseline(tuple(sorted(case.gpt.items())))
    tol = TOLERANCE.get(case.name, EXACT)
    diffs = [abs(a - b) for a, b in zip(got, want, strict=True)]
    assert max(diffs) <= tol, f"{case.name}: up to {max(diffs):.2e} > {tol:.0e}\n{got}\n{want}"


def bytes_of(records: dict[int, dict], case: str, kind: str) -> int:
    """The largest count over ranks of `kind` bytes this rank holds."""
    return max(records[r][case][kind] for r in range(RANKS))


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_zero_keeps_less_state_per_rank_than_ddp(results):
    records = results("data")
    ddp = {k: bytes_of(records, "ddp", k)
           for k in ("optimizer_state_bytes", "grad_bytes", "param_bytes")}
    # Stage 1: half the AdamW state per rank (whole tensors per rank, so about
    # half); gradients and parameters stay whole.
    zero1 = bytes_of(records, "zero1", "optimizer_state_bytes")
    assert 0.4 * ddp["optimizer_state_bytes"] < zero1 < 0.6 * ddp["optimizer_state_bytes"]
    assert bytes_of(records, "zero1", "grad_bytes") == ddp["grad_bytes"]
    assert bytes_of(records, "zero1", "param_bytes") == ddp["param_bytes"]
    # Stages 2 and 3: state, gradients and parameters are shards of about half.
    for case in ("zero2", "zero3", "zero3-offload"):
        for kind, full in ddp.items():
            mine = bytes_of(records, case, kind)
            assert 0.45 * full < mine < 0.55 * full, (case, kind, mine, full)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_ddp_accumulation_syncs_on_the_last_micro_step_only(results):
    records = results("data")
    for r in range(RANKS):
        # 2 micro-steps per step, one bucket: one all-reduce per step, two without no_sync.
        assert records[r]["ddp-accumulation"]["allreduces_per_step"] == 1
        assert records[r]["ddp-accumulation-sync-every"]["allreduces_per_step"] == 2


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_fp16_with_zero_uses_the_sharded_scaler(results):
    records = results("data")
    assert {records[r]["zero3-fp16"]["grad_scaler"] for r in range(RANKS)} == {"ShardedGradScaler"}


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize(("family", "case"), [("pipeline", "pipeline-1f1b"), ("tensor", "tensor")])
def test_model_parallel_ranks_hold_part_of_the_model(results, family, case):
    records = results(family)
    gpt = FAMILIES[family][1][[c.name for c in FAMILIES[family][1]].index(case)].gpt
    model = tiny_gpt(**gpt).build_model()
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    for r in range(RANKS):
        assert records[r][case]["param_bytes"] < 0.75 * full, (r, records[r][case]["param_bytes"])
