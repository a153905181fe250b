"""`harness verify --with hf-trainer`: the study's best re-run inside the Hugging Face
Trainer, and every exported setting read back from the running Trainer (its args, the
model's checkpointing flag, the optimizer's class and fused flag, the micro-steps per
optimizer step, the process group and the wrapper), not taken from the file.

The run folder here is written by hand (a tuner's trials.jsonl holds the same keys): its
samples/s are the harness side's inputs to the table, not claims; what is checked is
what the Trainer ran. The Trainer runs are `slow` (a process importing transformers),
the two-rank ones `distributed` too (torchrun, gloo, a free port, a timeout)."""

from __future__ import annotations

import json

import pytest

from tests.export import plans
from training_harness.cli.main import main
from training_harness.export.verify import (
    Row,
    ranking,
    settings_lost,
    table,
    top_records,
    verify_one,
)


def record(trial_id, plan, rate, phase="search"):
    return {"schema": 1, "study": "t", "trial_id": trial_id, "status": "ok", "reason": None,
            "plan": plan.to_dict(), "metrics": {"samples_per_s": rate,
                                                "window": {"steps": plan.steps}},
            "tags": {"phase": phase}}


def run_folder(tmp_path, records):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_top_records_are_the_fastest_ok_ones(tmp_path):
    p = plans.single()
    failed = {**record(9, p, None), "status": "oom", "metrics": {}}
    run = run_folder(tmp_path, [record(0, p, 2.0, "baseline"), record(1, p, 5.0), failed,
                                record(2, p, 3.0)])
    assert [r["trial_id"] for r in top_records(run, 2)] == [1, 2]


def test_a_configuration_the_trainer_cannot_run_is_named_without_starting_it(tmp_path):
    lamb = record(1, plans.plan({"lamb": {}}), 4.0)
    row = verify_one(lamb, tmp_path / "1", timeout_s=1)
    assert row.cannot and row.cannot.startswith("lamb: the Trainer's `optim` has no LAMB")
    assert not (tmp_path / "1").exists()  # nothing was started
    piped = record(2, plans.plan({"pipeline": {}}).replace(
        layout=plans.Plan.from_dict({"layout": {"pipeline": 2}}).layout), 4.0)
    assert "no pipeline parallelism" in verify_one(piped, tmp_path / "2", 1).cannot


def test_settings_lost_compares_the_running_trainer_with_the_file():
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "bf16": True,
            "optim": "adamw_torch_fused", "activation_checkpointing": True, "use_cpu": True}
    model_kwargs = {"attn_implementation": "sdpa"}  # the sidecar's
    seen = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
            "micro_steps_per_step": [2], "mixed_precision": "bf16",
            "optim": "adamw_torch_fused", "optimizer_fused": True,
            "model_is_gradient_checkpointing": True, "torch_compile": False,
            "world_size": 1, "distributed_type": "NO", "attn_implementation": "sdpa"}
    assert settings_lost(args, seen, 1, model_kwargs) == []
    assert settings_lost(args, {**seen, "attn_implementation": "eager"}, 1, model_kwargs) == [
        "attn_implementation: exported 'sdpa', the Trainer ran 'eager'"]
    lost = settings_lost(args, {**seen, "model_is_gradient_checkpointing": False,
                                "optimizer_fused": False}, 1, model_kwargs)
    assert lost == ["optimizer_fused: exported True, the Trainer ran False",
                    "checkpointing: exported True, the Trainer ran False"]


def test_ranking_holds_or_names_the_trainers_order():
    a, b = Row(1, "a", 5.0, trainer_rates=[4.0]), Row(2, "b", 3.0, trainer_rates=[2.0, 1.0, 3.0])
    assert b.trainer_rate == 2.0  # the median of its repeats
    assert ranking([a, b]).startswith("ranking: holds")
    b.trainer_rates = [4.5]
    assert ranking([a, b]).startswith("ranking: differs: the Trainer orders them trial 2 > "
                                      "trial 1, the harness trial 1 > trial 2 (one Trainer run")
    a.trainer_rates, b.trainer_rates = [3.0, 4.0, 5.0], [4.2, 4.5, 4.6]  # overlapping
    assert ranking([a, b]).endswith("(each swap within the Trainer's spread over its "
                                    "repeats: not beyond the noise)")
    a.trainer_rates = [3.0, 3.5, 4.0]  # b beats each of a's runs
    assert ranking([a, b]).endswith("the harness trial 1 > trial 2")


def test_the_table_compares_with_bench_where_measured():
    """--bench --repeats 3: medians of each side; the ratio is the Trainer's over bench's."""
    r = Row(5, "d1p1t1 mb 8 | amp(dtype=bf16)", 9.0, trainer_rates=[3.0, 4.0, 5.0],
            bench_rates=[8.0, None, 6.0])
    assert r.ratio == pytest.approx(4.0 / 7.0)
    text = table([r])
    head, first = text.splitlines()[:2]
    assert head.split()[:6] == ["#", "trial", "study/s", "bench/s", "trainer/s", "ratio"]
    assert first.split()[:6] == ["1", "5", "9.00", "7.00", "4.00", "0.57"]
    assert ("#1 samples/s over 3 repeats: Trainer 4.00 [3.00, 5.00]; harness bench 7.00 "
            "[6.00, 8.00]") in text


def test_verify_refuses_a_folder_without_records(tmp_path, capsys):
    assert main(["verify", str(tmp_path), "--with", "hf-trainer"]) == 2
    assert "no trials.jsonl" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_verify_reads_every_setting_back_in_one_process_and_under_torchrun(tmp_path, capsys):
    """One `harness verify` of the best (one process), a DDP plan (two ranks under
    torchrun) and a LAMB plan (not started). The DDP record was its own test, with a plain
    baseline record here beside the best: each Trainer run is a new interpreter importing
    transformers (~14 CPU-s), so the plain run's checks of settings read back as off
    (bf16, checkpointing, fused AdamW, SDPA) are test_verify_fsdp_on_cpus_...'s now."""
    best = plans.single()
    run = run_folder(tmp_path, [record(5, best, 9.0), record(3, plans.ddp(), 5.0),
                                record(7, plans.plan({"lamb": {}}), 1.0)])
    assert main(["verify", str(run), "--with", "hf-trainer", "--top", "3",
                 "--timeout", "500"]) == 0
    out = capsys.readouterr().out
    seen = json.loads((run / "verify" / "5" / "result.json").read_text())["observed"]
    assert seen["bf16"] and seen["mixed_precision"] == "bf16"
    assert seen["optim"] == "adamw_torch_fused"
    assert seen["optimizer_class"] == "AdamW" and seen["optimizer_fused"]
    assert seen["model_is_gradient_checkpointing"]
    assert seen["gradient_accumulation_steps"] == 2 and seen["micro_steps_per_step"] == [2]
    assert seen["per_device_train_batch_size"] == 2
    assert seen["attn_implementation"] == "sdpa"
    assert seen["distributed_type"] == "NO" and seen["world_size"] == 1
    assert seen["lr_scheduler"] == "LambdaLR" and seen["max_grad_norm"] == 0.0  # constant lr
    # the DDP plan under torchrun: two ranks, the same settings kept through the wrapper
    ran = run / "verify" / "3"
    assert (ran / "result.json").exists(), (ran / "log.txt").read_text()[-4000:]
    ddp = json.loads((ran / "result.json").read_text())["observed"]
    assert ddp["world_size"] == 2 and ddp["distributed_type"] == "MULTI_CPU"
    assert ddp["wrapper"] == "DistributedDataParallel"
    assert ddp["micro_steps_per_step"] == [2] and ddp["gradient_accumulation_steps"] == 2
    assert ddp["optimizer_fused"] and ddp["model_is_gradient_checkpointing"]
    assert "#1 settings read back from the running Trainer: as exported" in out
    assert "#2 settings read back from the running Trainer: as exported" in out  # lost == []
    assert "#3 (trial 7) the Trainer cannot run it as measured: lamb:" in out
    head = next(line for line in out.splitlines() if "trainer/s" in line)
    assert head.split()[:5] == ["#", "trial", "study/s", "trainer/s", "ratio"]
    first, second = out.splitlines()[out.splitlines().index(head) + 1:][:2]
    first = first.split()
    assert first[:2] == ["1", "5"] and second.split()[:2] == ["2", "3"]  # fastest first
    study, trainer, ratio = map(float, first[2:5])
    assert study == 9.0 and trainer > 0 and ratio == pytest.approx(trainer / study, abs=0.01)
    assert "ranking: " in out


def failure(row, folder) -> str:
    """Why the Trainer run failed, with its log's tail (torchrun's ranks print above)."""
    log = folder / "log.txt"
    return f"{row.failed}\n{log.read_text()[-4000:] if log.exists() else ''}"


# test_verify_ddp_two_ranks_under_torchrun: its DDP run and checks are in
# test_verify_reads_every_setting_back_in_one_process_and_under_torchrun.


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_verify_fsdp_on_cpus_catches_the_trainer_running_ddp(tmp_path):
    """ZeRO-2 exports as fsdp = true (FSDP2, no reshard); on CPUs accelerate enters FSDP
    for accelerators only and the Trainer trains with DDP. The file says so (its nearest),
    and verify, reading the running Trainer, names what it did not take. Without amp,
    fused or SDPA in the plan, it also shows those read back as off (the plain baseline
    run's checks, once in the one-process test)."""
    plain_zero2 = plans.plan({"zero": {"stage": 2}, "checkpoint": {}}, data=2, gb=8)
    row = verify_one(record(4, plain_zero2, 5.0), tmp_path / "4", timeout_s=500)
    assert row.trainer_rate, failure(row, tmp_path / "4")
    assert any(n.startswith("zero.stage = 2 on a CPU") for n in row.nearest)
    seen = row.observed
    assert seen["fsdp"] and seen["world_size"] == 2  # the args took it ...
    assert seen["distributed_type"] == "MULTI_CPU"  # ... accelerate did not
    assert seen["wrapper"] == "DistributedDataParallel"
    assert "distributed_type: exported 'FSDP', the Trainer ran 'MULTI_CPU'" in row.lost
    assert "checkpointing: exported True, the Trainer ran False" in row.lost
    assert not seen["model_is_gradient_checkpointing"]
    assert not seen["bf16"] and seen["mixed_precision"] == "no"
    assert seen["optim"] == "adamw_torch" and not seen["optimizer_fused"]
    assert seen["attn_implementation"] == "eager"
