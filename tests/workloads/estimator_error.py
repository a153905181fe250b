"""The estimator's error on hf: and torchvision: models, on this CPU: the docs table.

    python tests/workloads/estimator_error.py > table.md

For each model and technique (fp32, activation checkpointing, bf16 autocast), one
process composes the plan (strategies.compose), trains two steps and counts, in the
second, the peak bytes of the tensors alive that the step made (parameters, buffers
and optimizer state left out: tests/estimator/measure.LiveBytes, as tests/estimator
does for the gpt), against the estimator's peak less those persistent parts
(training_harness.measure.prepare: what `harness tune` predicts). A count of tensors, not the
process's RSS (which holds the runtime besides) nor a timing: it does not depend on
what else the machine runs. Errors are (predicted - measured) / measured.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LM = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, vocab_size=2048,
          seq_len=128)
MODELS = {
    "hf:llama": {**LM, "intermediate_size": 344, "num_key_value_heads": 2},
    "hf:gpt2": dict(n_layer=2, n_embd=128, n_head=4, vocab_size=2048, n_positions=128,
                    seq_len=128, bos_token_id=0, eos_token_id=0),
    "hf:bert": {**LM, "intermediate_size": 512, "max_position_embeddings": 128},
    "hf:opt": {**LM, "ffn_dim": 512, "max_position_embeddings": 128, "word_embed_proj_dim": 128},
    # 128 px: at 64 the optimizer step (gradients and AdamW's temporaries) is the peak
    "torchvision:resnet18": dict(num_classes=10, image_size=128),
}
TECHNIQUES = {"fp32": {}, "checkpoint": {"checkpoint": {}}, "bf16": {"amp": {"dtype": "bf16"}}}
MICRO = 8
PERSISTENT = ("parameters", "optimizer_state", "buffers")


def measure(name: str, args: dict, strategies: dict) -> dict:
    import torch

    from tests.estimator.measure import LiveBytes
    from training_harness.core.plan import Plan
    from training_harness.measure.batches import split_batch
    from training_harness.measure.prepare import prepare
    from training_harness.strategies.compose import compose

    plan = Plan(workload=name, workload_args=args, device="cpu", micro_batch_size=MICRO,
                global_batch_size=MICRO, strategies=strategies)
    prep = prepare(plan)
    predicted = prep.predicted
    torch.manual_seed(0)
    model = prep.workload.build_model()
    setup = compose(model, plan, "cpu")
    batches = [split_batch(prep.workload.batch(MICRO, s, "cpu"), 1) for s in range(2)]
    setup.step(batches[0], prep.workload.loss)  # optimizer state exists from here on
    opt = setup.optimizer
    kept = [*setup.model.parameters(), *setup.model.buffers(),
            *(t for st in opt.state.values() for t in st.values() if torch.is_tensor(t))]
    with LiveBytes({t.untyped_storage().data_ptr() for t in kept}) as live:
        setup.step(batches[1], prep.workload.loss)
    mem = predicted["peak_memory_bytes"] - sum(predicted["memory"][k] for k in PERSISTENT)
    return {"live": live.peak, "predicted": mem}


def main() -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, micro-batch {MICRO}\n")
    print("| model | technique | live tensors, measured | predicted | error |")
    print("| --- | --- | --- | --- | --- |")
    errors = []
    for name, args in MODELS.items():
        for technique, strategies in TECHNIQUES.items():
            r = measure(name, args, strategies)
            error = (r["predicted"] - r["live"]) / r["live"]
            errors.append(abs(error))
            print(f"| `{name}` | {technique} | {r['live'] / 2**20:.2f} MiB | "
                  f"{r['predicted'] / 2**20:.2f} MiB | {error:+.1%} |", flush=True)
    print(f"\nMedian |error| {statistics.median(errors):.1%}, largest {max(errors):.1%}")


if __name__ == "__main__":
    main()
