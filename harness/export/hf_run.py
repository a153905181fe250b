"""One configuration trained inside the Hugging Face Trainer, timed, and what the running
Trainer really used read back from it: `harness verify`'s torch side.

    python -m training_harness.export.hf_run PLAN.toml TRAINER.json OUT.json   (one process)
    torchrun --nproc-per-node N -m training_harness.export.hf_run ...          (data parallel)

TRAINER.json is `harness export --to hf-trainer`'s file, read by HfArgumentParser as a
user would; only the run's length and its output are added. The model, the data and the
micro-batch are the plan's workload's (the same builder and token source the harness
trial used); the loss is the workload's cross-entropy of the logits. The step time is
the Trainer's own loop from one optimizer step's end to the next's (its data loader,
callbacks and logging included), over the same number of timed steps after warm-up.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _rows(workload: Any, mb: int, n_rows: int) -> list[tuple[Any, Any]]:
    """`n_rows` samples: the workload's own micro-batches (index 0, 1, ...) split in rows."""
    rows: list[tuple[Any, Any]] = []
    index = 0
    while len(rows) < n_rows:
        batch = workload.batch(mb, index, "cpu")
        if len(batch) != 2:
            raise SystemExit("verify: the Trainer run takes (input_ids, labels) batches; "
                             "an encoder-decoder's three are not supported yet")
        rows += list(zip(batch[0], batch[1], strict=True))
        index += 1
    return rows[:n_rows]


def _checkpointing(model: Any) -> bool:
    """The model's own flag: transformers 5's name, else 4's (asked only where it exists,
    since reading the old name warns)."""
    name = ("is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing")
            else "is_gradient_checkpointing")
    return bool(getattr(model, name, False))


def _observed(trainer: Any, model: Any, optimizer: Any) -> dict[str, Any]:
    """What the running Trainer uses: its args, the model's flags, the optimizer."""
    import torch

    a = trainer.args
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    group = inner.param_groups[0]
    wrapped = trainer.model_wrapped
    ckpt_wrappers = sum(type(m).__name__ == "CheckpointWrapper" for m in model.modules())
    return {
        "per_device_train_batch_size": a.per_device_train_batch_size,
        "gradient_accumulation_steps": a.gradient_accumulation_steps,
        "bf16": a.bf16, "fp16": a.fp16, "tf32": a.tf32,
        "optim": str(getattr(a.optim, "value", a.optim)),
        "optimizer_class": type(inner).__name__,
        "optimizer_fused": bool(group.get("fused")),
        "optimizer_foreach": bool(group.get("foreach")),
        "activation_checkpointing": bool(a.activation_checkpointing),
        "model_is_gradient_checkpointing": _checkpointing(model),
        "checkpoint_wrapped_layers": ckpt_wrappers,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "torch_compile": a.torch_compile,
        "fsdp": bool(a.fsdp),
        "world_size": a.world_size,
        "distributed_type": str(trainer.accelerator.distributed_type).split(".")[-1],
        "mixed_precision": trainer.accelerator.mixed_precision,
        "wrapper": type(wrapped).__name__,
        "lr_scheduler": type(trainer.lr_scheduler).__name__,
        "max_grad_norm": a.max_grad_norm,
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str]) -> int:
    # `python -m training_harness.export.hf_run` imported harness first: torchvision's mend is in
    # place before transformers comes (training_harness.workloads.optional)
    plan_path, trainer_json, out = argv
    import torch
    from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

    from training_harness.core.plan import Plan
    from training_harness.workloads import load_workload
    from training_harness.workloads.hf import lm_loss

    plan = Plan.from_toml(plan_path)
    fields = json.loads(Path(trainer_json).read_text())
    # steps and warm-up (the run's length) and the sidecar's model kwargs: not the config
    run = fields.pop("harness_run")
    model_kwargs = run["model_kwargs"]
    work_dir = Path(out).parent / "trainer_output"
    fields.update(output_dir=str(work_dir), max_steps=run["warmup"] + run["steps"],
                  report_to="none", save_strategy="no", logging_strategy="no",
                  disable_tqdm=True, dataloader_drop_last=True, dataloader_num_workers=0)
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(fields)  # its defaults

    workload_args = {**plan.workload_args, **model_kwargs}
    workload = load_workload(plan.workload, workload_args)
    torch.manual_seed(plan.seed)
    model = workload.build_model()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_rank = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    rows = _rows(workload, args.per_device_train_batch_size, per_rank * world)

    def collate(samples: list[tuple[Any, Any]]) -> dict[str, Any]:
        return {"input_ids": torch.stack([s[0] for s in samples]),
                "labels": torch.stack([s[1] for s in samples])}

    calls = {"n": 0}

    def loss_func(outputs: Any, labels: Any, num_items_in_batch: Any = None) -> Any:
        calls["n"] += 1
        return lm_loss(outputs.logits, labels)

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.calls_at_end: list[int] = []
            self.seen: dict[str, Any] | None = None

        def on_step_end(self, args, state, control, model=None, optimizer=None, **kw):
            if torch.cuda.is_available() and args.device.type == "cuda":
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())
            self.calls_at_end.append(calls["n"])
            if self.seen is None:  # after the first step: the optimizer and wrappers exist
                self.seen = _observed(trainer, model, optimizer)

    timer = Timer()
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate,
                      compute_loss_func=loss_func, callbacks=[timer])
    trainer.train()
    warm, steps = run["warmup"], run["steps"]
    ends = timer.ends
    if len(ends) < warm + steps or warm < 1:
        raise SystemExit(f"verify: the Trainer ran {len(ends)} steps of {warm + steps}")
    window = ends[warm + steps - 1] - ends[warm - 1]
    each = [b - a for a, b in zip(ends[warm - 1:], ends[warm:], strict=False)]
    micro = [b - a for a, b in zip(timer.calls_at_end[warm - 1:], timer.calls_at_end[warm:],
                                   strict=False)]
    global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    if int(os.environ.get("RANK", "0")) == 0:
        import accelerate
        import transformers

        result = {
            "samples_per_s": global_batch * steps / window,
            "window_s": window, "steps": steps, "warmup": warm,
            "step_time_s": {"median": statistics.median(each), "min": min(each),
                            "max": max(each)},
            "global_batch": global_batch,
            "observed": {**(timer.seen or {}), "micro_steps_per_step": sorted(set(micro))},
            "versions": {"transformers": transformers.__version__,
                         "accelerate": accelerate.__version__, "torch": torch.__version__},
        }
        Path(out).write_text(json.dumps(result, indent=2))
    if torch.distributed.is_initialized():
        # Torn down here, not at the interpreter's exit: a gloo group left to exit's
        # destructors can abort a rank ("terminate called without an active exception")
        # after the run has succeeded, and torchrun then reports the run failed.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    from training_harness.core.paused_imports import import_paused

    import_paused("torch", "transformers.trainer")  # 4.1 CPU-s against 5.1 with it on
    code = main(sys.argv[1:])
    # Out without the interpreter's teardown: the group torn down above still left a rank
    # aborted now and then by exit's destructors ("terminate called without an active
    # exception", once in 2026-11-27's suite runs) after its run had succeeded. Its result
    # is written and closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
