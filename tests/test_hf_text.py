"""A Hugging Face causal LM on the text corpus: the corpus' bytes as its tokens (vocab_size
256 unless given), the same windows as the gpt workload's, and trained to a target
loss; the attention kernel it runs with leaves the cached steps to target valid."""

from __future__ import annotations

import pytest
import torch

from tests.workloads.tiny_hf import needs_transformers
from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.core.target import TargetSpec
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial
from training_harness.workloads import load_workload
from training_harness.workloads.corpus import text_split

LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=2, seq_len=32, data="text")
PEAK = {"dtype": "fp32", "datasheet": None, "used": "measured", "reason": "test",
        "measured": {"flops": 1e12, "source": "test: a fixed figure"}}


@pytest.fixture(autouse=True)
def transformers_and_own_cache(tmp_path, monkeypatch):
    needs_transformers()
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))


def test_hf_llama_reads_the_corpus_bytes():
    w = load_workload("hf:llama", LLAMA)
    assert w.vocab == 256 and w.data == "text"  # the corpus' bytes, not llama's 32000
    gpt = load_workload("gpt", dict(layers=1, heads=2, hidden=32, seq_len=32, vocab=256,
                                    data="text"))
    for a, b in zip(w.batch(4, 3, "cpu"), gpt.batch(4, 3, "cpu"), strict=True):
        assert torch.equal(a, b)  # the same training windows, shifted by one for targets
    x, y = w.eval_batch(2, 0, "cpu")
    held = text_split().validation[0]
    assert x[0].tolist() == held[:32].tolist() and y[0].tolist() == held[1:33].tolist()
    assert w.data_info()["digest"] == text_split().digest


def test_hf_data_mistakes():
    with pytest.raises(HarnessError, match="set vocab_size to at least"):
        load_workload("hf:llama", {**LLAMA, "vocab_size": 64})
    with pytest.raises(HarnessError, match="causal LMs only"):
        load_workload("hf:bert", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, seq_len=32, data="text"))
    with pytest.raises(HarnessError, match="not tokens"):
        load_workload("hf:llama", {**LLAMA, "data": "digits"})


@pytest.mark.slow  # two trials, the first training to the target loss on text
def test_hf_llama_trains_to_a_target_loss_on_text():
    plan = Plan(name="hf-text", workload="hf:llama", workload_args=LLAMA, device="cpu",
                micro_batch_size=8, global_batch_size=16, warmup_steps=1, steps=2,
                strategies={"accumulation": {}},
                target=TargetSpec(loss=4.5, max_samples=512, eval_every=64, eval_samples=32))
    plan.optimizer.lr = 1e-2
    first = run_trial(prepare(plan, peaks={"fp32": PEAK}), "test")
    assert first.status == "ok", first.reason
    assert first.metrics["data"]["loader"] == "dataloader"
    run = first.metrics["convergence"]["runs"][0]
    assert run["curve"][0]["val_loss"] > 5.0 > 4.5 >= run["curve"][-1]["val_loss"]  # ln 256
    # sdpa instead of eager attention, one micro-batch: the maths is unchanged, so cached
    sdpa = plan.replace(workload_args={**LLAMA, "attn_implementation": "sdpa"},
                        micro_batch_size=16, strategies={})
    again = run_trial(prepare(sdpa, peaks={"fp32": PEAK}), "test")
    assert again.metrics["convergence"]["runs"][0]["cached"]
    assert again.metrics["steps_to_target"] == first.metrics["steps_to_target"]
