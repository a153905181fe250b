"""ddp compression = "powersgd" without ranks: its refusals, its search space, what the
estimator makes of it (bytes on the wire, memory kept) and what each export names.
Its numerics and its effect on 2 ranks: tests/distributed/test_powersgd.py."""

from __future__ import annotations

import pytest

from tests.estimator.models import CUDA
from tests.estimator.test_parallel import PSI, H, Square, square_plan
from training_harness.core.device import RuntimeEnv
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan
from training_harness.estimator import estimate
from training_harness.estimator.compression import powersgd_elements
from training_harness.strategies.compose import reasons_against
from training_harness.strategies.registry import get

CPU = RuntimeEnv("cpu", "cpu", 1, bf16=True, triton=False)
PSGD = {"compression": "powersgd", "start_powersgd_iter": 10}


def plan(strategies, data=2, micro=2, global_batch=None) -> Plan:
    return Plan(workload_args=dict(layers=2, heads=2, hidden=32, seq_len=16, vocab=64),
                layout=Layout(data=data), micro_batch_size=micro,
                global_batch_size=global_batch, strategies=strategies)


def test_powersgd_runs_on_the_cpu_with_gloo():
    assert reasons_against(plan({"ddp": PSGD}), CPU) == []
    assert reasons_against(plan({"ddp": PSGD, "accumulation": {}}, global_batch=8), CPU) == []


@pytest.mark.parametrize(("strategies", "global_batch", "expected"), [
    ({"ddp": PSGD, "accumulation": {"sync_last_only": False}}, 8,
     "set [strategies.accumulation] sync_last_only = true"),
    ({"ddp": PSGD, "zero": {"stage": 1}}, None, "ddp and zero are mutually exclusive"),
])
def test_refused_in_one_line(strategies, global_batch, expected):
    reasons = reasons_against(plan(strategies, global_batch=global_batch), CPU)
    assert reasons and all(expected in r for r in reasons), reasons  # ddp's and zero's


@pytest.mark.parametrize(("table", "expected"), [
    ({**PSGD, "powersgd_rank": 0}, "powersgd_rank: must be 1 or more"),
    # torch's PowerSGDState refuses start_powerSGD_iter <= 1 with error feedback on
    ({**PSGD, "start_powersgd_iter": 1}, "start_powersgd_iter: must be 2 or more"),
])
def test_settings_torch_refuses_are_refused(table, expected):
    with pytest.raises(HarnessError, match=expected):
        get("ddp").parse(table)


def test_searchable():
    space = get("ddp").space()
    assert "powersgd" in space["compression"].values
    assert space["powersgd_rank"].values == (1, 4)
    assert space["start_powersgd_iter"].values == (10, 1000)


def test_torchs_compression_rule():
    assert powersgd_elements((32, 16), 1) == (48, True)
    assert powersgd_elements((8, 32), 2) == (80, True)
    assert powersgd_elements((32,), 4) == (32, False)  # 1-D: whole
    assert powersgd_elements((4, 4), 2) == (16, False)  # (4 + 4) 2 x 2 is not under 16
    assert powersgd_elements((64, 3, 3, 3), 2) == ((64 + 27) * 2, True)  # out x the rest


def test_the_estimate_sends_the_factors_and_keeps_the_error_feedback():
    w = Square()  # four H x H matrices, no bias

    def of(**ddp):
        return estimate(square_plan(2, ddp=ddp), w, CUDA, peak_flops=1e15)

    plain, psgd, half = of(), of(**PSGD, powersgd_rank=2), of(compression="fp16")
    grads = 4 * PSI  # bytes: PSI parameters in fp32
    sent = 4 * 4 * (H + H) * 2  # four matrices' fp32 factors P and Q of rank 2
    assert plain.step_parts["data"] / psgd.step_parts["data"] == pytest.approx(grads / sent)
    assert plain.step_parts["data"] / half.step_parts["data"] == pytest.approx(2)
    # error feedback the gradients' size, and the factors, kept; a bucket's copy and the
    # new error in the hook
    assert psgd.memory["gradient_buckets"] == grads + sent
    assert psgd.memory["communication_buffers"] == 2 * grads
    assert any("PowerSGD rank 2 is estimated after its warm-up" in a
               and "its first 10 steps" in a for a in psgd.assumptions)


NEAREST = {  # each stack's nearest to torch's PowerSGD hook, as its export names it
    "hf-trainer": "powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=2, "
                  "start_powerSGD_iter=100)",
    "accelerate": "DDPCommunicationHookType.POWER_SGD, comm_state_option="
                  "{'matrix_approximation_rank': 2, 'start_powerSGD_iter': 100}",
    "lightning": "DDPStrategy(ddp_comm_state=powerSGD_hook.PowerSGDState(None, "
                 "matrix_approximation_rank=2, start_powerSGD_iter=100), "
                 "ddp_comm_hook=powerSGD_hook.powerSGD_hook)",
    "deepspeed": "OneBitAdam, freeze_step = 100",
    "torchtitan": "uncompressed gradients",
}


@pytest.mark.parametrize("stack", sorted(NEAREST))
def test_each_export_names_its_nearest(stack):
    from tests.export import plans
    from training_harness.export import STACKS, export_plan

    assert set(NEAREST) == set(STACKS)
    p = plans.plan({"ddp": {"compression": "powersgd", "powersgd_rank": 2,
                            "start_powersgd_iter": 100}}, data=2, gb=4)
    lost = {n.setting: n for n in export_plan(p, stack, "test").not_expressed}
    named = [n for s, n in lost.items() if s.startswith("ddp.compression = powersgd")]
    assert len(named) == 1 and NEAREST[stack] in named[0].nearest, lost
    assert "communication_data_type" not in export_plan(p, stack, "test").text


def test_its_rank_and_warm_up_are_in_the_maths_key():
    from training_harness.core.target import maths_key, technique_name

    def key(ddp):
        return maths_key(plan({"ddp": ddp}).to_dict(), 0, "cpu")

    plain = key({})
    assert key({"compression": "fp16"}) == plain  # as before: not a cached key changed
    keys = {key({**PSGD, "powersgd_rank": r, "start_powersgd_iter": s})
            for r in (1, 2) for s in (2, 10)}
    assert len(keys) == 4 and plain not in keys
    assert technique_name({"ddp": PSGD}) == "adamw + powersgd"


RUN_TO_TARGET = """
import json, torch, torch.distributed as dist
from training_harness.core.plan import Layout, Plan
from training_harness.core.target import TargetSpec
from training_harness.measure.convergence import train_to_target
from training_harness.workloads import load_workload
args = dict(layers=1, heads=2, hidden=32, seq_len=32, vocab=256, data="text")
out = {}
for name, ddp in (("plain", {}), ("powersgd", {"compression": "powersgd",
                                               "start_powersgd_iter": 3})):
    p = Plan(workload="gpt", workload_args=args, device="cpu", layout=Layout(data=2),
             micro_batch_size=4, global_batch_size=8, strategies={"ddp": ddp},
             target=TargetSpec(loss=1.0, seeds=[0], max_samples=48, eval_every=8,
                               eval_samples=16))
    run = train_to_target(p, load_workload("gpt", args), torch.device("cpu"), None, 0)
    out[name] = [c["val_loss"] for c in run["curve"]]
    assert not dist.is_initialized()  # its group of one process is gone
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_the_run_to_a_target_trains_powersgd_in_one_process():
    """In a process with no group (strategies.ddp.alone makes one of it alone): the
    validation losses after each step equal plain AdamW's through the 3 warm-up steps,
    then depart."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", RUN_TO_TARGET], capture_output=True,
                          text=True, timeout=110, cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    curves = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, psgd = curves["plain"], curves["powersgd"]
    assert psgd[:4] == pytest.approx(plain[:4], abs=1e-6)  # at 0 samples and 3 steps
    assert all(abs(a - b) > 1e-5 for a, b in zip(psgd[4:], plain[4:], strict=True))
