"""The zoo sweep: every model type transformers knows with a causal-LM, masked-LM or
seq2seq-LM head (encoder-decoders train copy with noise), built tiny
(training_harness.workloads.hf_tiny), estimated (the activation trace included) and trained one
step on the CPU, with checkpointing on where the block finder finds blocks.
Each type comes out `ok` or `refused` with one line that says why.

`check("qwen2")` runs one type in this process; `tests/workloads/zoo_hf.py` runs them all in
worker processes and writes the table (docs/benchmarks/zoo_hf_cpu_2026-11-24.md);
tests/test_zoo_hf.py holds the table.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

OK, REFUSED = "ok", "refused"
MICRO = 2
TIMEOUT_S = 120


@dataclass
class Outcome:
    model_type: str
    status: str  # OK or REFUSED
    line: str  # why refused; for ok, how it was traced and what was checkpointed
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def types() -> list[str]:
    """Every model type with a causal-LM, masked-LM or seq2seq-LM head in this
    transformers."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    heads = (set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(MODEL_FOR_MASKED_LM_MAPPING_NAMES)
             | set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES))
    return sorted(t for t in heads if t in CONFIG_MAPPING_NAMES)


def one_line(text: str, limit: int = 200) -> str:
    line = " ".join(str(text).replace("\\n", " ").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _reason(stage: str, e: BaseException) -> str:
    from training_harness.core.errors import HarnessError
    from training_harness.estimator.trace import stopped_by

    if isinstance(e, HarnessError):
        return one_line(f"{stage}: {e}")
    return one_line(f"{stage}: {stopped_by(e)}")


class _Timeout(BaseException):  # not caught as a model's own failure
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _Timeout(f"took more than {TIMEOUT_S} s")


def check(model_type: str, timeout_s: int = TIMEOUT_S) -> Outcome:
    """Build, estimate and train one step of a tiny `model_type`; never raises.
    `timeout_s` 0: no alarm of its own (under pytest-timeout, which uses SIGALRM)."""
    start = time.perf_counter()
    old = None
    if timeout_s:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout_s)
    try:
        status, line = _check(model_type)
    except Exception as e:  # the sweep records every failure as a line
        status, line = REFUSED, _reason("unexpected", e)
    except _Timeout as e:
        status, line = REFUSED, f"timeout: {e}"
    finally:
        if timeout_s:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return Outcome(model_type, status, one_line(line), round(time.perf_counter() - start, 2))


def _check(model_type: str) -> tuple[str, str]:
    import torch

    from training_harness.workloads import optional

    optional.transformers()  # mends a torchvision built for another torch first

    from training_harness.core.device import RuntimeEnv
    from training_harness.core.plan import Plan
    from training_harness.estimator import estimate
    from training_harness.measure.batches import split_batch
    from training_harness.strategies.compose import compose
    from training_harness.workloads import load_workload
    from training_harness.workloads.blocks import find_blocks
    from training_harness.workloads.hf_tiny import tiny_fields

    stage = "config"
    try:
        args = tiny_fields(model_type)
        workload = load_workload(f"hf:{model_type}", args)
        stage = "build"
        torch.manual_seed(0)
        model = workload.build_model()
        blocks = find_blocks(model)
        strategies: dict[str, Any] = {"checkpoint": {}} if blocks else {}
        plan = Plan(workload=f"hf:{model_type}", workload_args=args, micro_batch_size=MICRO,
                    global_batch_size=MICRO, strategies=strategies, device="cpu",
                    warmup_steps=0, steps=1)
        stage = "estimate"
        predicted = estimate(plan, workload, RuntimeEnv.detect("cpu"))
        stage = "train"
        setup = compose(model, plan, "cpu")
        batch = workload.batch(MICRO, 0, "cpu")
        loss = setup.step(split_batch(batch, plan.accumulation_steps), workload.loss)
    except Exception as e:
        return REFUSED, _reason(stage, e)
    value = float(loss.item())
    if not math.isfinite(value):
        return REFUSED, f"train: the first step's loss is {value}"
    how = _how_traced(predicted.assumptions)
    ckpt = f"checkpoint {blocks.describe()}" if blocks else "no blocks found: no checkpointing"
    return OK, f"{workload.source.task}, {ckpt}; {how}; loss {value:.3f}"


def _how_traced(assumptions: list[str]) -> str:
    text = " ".join(assumptions)
    if "Activations are not predicted" in text:
        return "activations not traced (measured only)"
    if "traced one real sample on the CPU" in text:
        return "traced on one real CPU sample"
    if "traced on the meta device" in text:
        return "traced on meta"
    return "traced on fake tensors"


def main(argv: list[str] | None = None) -> None:
    """Worker: `python -m tests.workloads.hf_zoo OUT.jsonl TYPE ...` appends one JSON
    line per type ({"start": type} before it, so a crash names the type)."""
    import json
    import sys
    import warnings

    warnings.filterwarnings("ignore")
    args = sys.argv[1:] if argv is None else argv
    out, names = args[0], args[1:]
    import logging

    logging.disable(logging.WARNING)
    for name in names:
        with open(out, "a") as f:
            f.write(json.dumps({"start": name}) + "\n")
        result = check(name)
        with open(out, "a") as f:
            f.write(json.dumps(result.as_dict()) + "\n")


if __name__ == "__main__":
    main()
