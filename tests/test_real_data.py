"""Real data that ships with the install: the corpus and its split are deterministic,
the workloads read it, a user's files are read and their mistakes named, and a trial on
real data is fed through a DataLoader whose wait is in the record."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Plan
from training_harness.measure.prepare import prepare
from training_harness.measure.trial_loop import run_trial
from training_harness.workloads import load_workload
from training_harness.workloads.corpus import CHUNK, corpus_bytes, split_stream, text_split

GPT_TEXT = dict(layers=1, heads=2, hidden=32, seq_len=32, vocab=256, data="text")
PEAK = {"dtype": "fp32", "datasheet": None, "used": "measured", "reason": "test",
        "measured": {"flops": 1e12, "source": "test: a fixed figure"}}


def test_the_corpus_and_its_split_are_deterministic():
    a, b = corpus_bytes(), corpus_bytes()
    assert a == b and len(a) > 400_000  # Python's help pages: about 465k bytes
    split = text_split()
    again = split_stream(np.frombuffer(a, dtype=np.uint8), "again")
    assert split.digest == again.digest == hashlib.sha256(a).hexdigest()[:16]
    assert np.array_equal(split.train, again.train)
    assert all(np.array_equal(x, y) for x, y in zip(split.validation, again.validation,
                                                     strict=True))
    # the fixed rule: chunk i held out when i % 10 == 9; train + held out = the whole
    assert split.validation[0].tobytes() == a[9 * CHUNK:10 * CHUNK]
    assert len(split.train) + split.validation_tokens == len(a)
    assert 0.08 < split.validation_tokens / len(a) < 0.12


def test_gpt_reads_the_text_windows_and_holds_out_the_validation_chunks():
    w = load_workload("gpt", GPT_TEXT)
    x, y = w.batch(4, 3, "cpu")
    x2, _ = w.batch(4, 3, "cpu")
    assert x.shape == (4, 32) and torch.equal(x, x2) and torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(w.batch(4, 4, "cpu")[0], x)
    vx, vy = w.eval_batch(4, 0, "cpu")
    held = text_split().validation[0]
    assert vx[0].tolist() == held[:32].tolist() and vy[0].tolist() == held[1:33].tolist()
    assert w.data_info()["digest"] == text_split().digest


def test_data_mistakes_say_what_to_change(tmp_path):
    with pytest.raises(HarnessError, match="vocab to at least"):
        load_workload("gpt", {**GPT_TEXT, "vocab": 64})
    with pytest.raises(HarnessError, match="not tokens"):
        load_workload("gpt", {**GPT_TEXT, "data": "digits"})
    with pytest.raises(HarnessError, match="does not exist"):
        load_workload("gpt", {**GPT_TEXT, "data": str(tmp_path / "none.bin")})
    with pytest.raises(HarnessError, match="not images"):
        load_workload("resnet", {"data": "text"})


def test_a_users_token_files(tmp_path):
    ids = (np.arange(50_000) * 7 % 300).astype(np.uint16)
    ids.tofile(tmp_path / "tokens.bin")
    w = load_workload("gpt", {**GPT_TEXT, "vocab": 300, "data": str(tmp_path / "tokens.bin")})
    assert int(w.batch(2, 0, "cpu")[0].max()) < 300
    np.save(tmp_path / "tokens.npy", ids.astype(np.int32))
    w = load_workload("gpt", {**GPT_TEXT, "vocab": 300, "data": str(tmp_path / "tokens.npy")})
    assert w.data_info()["train_tokens"] + w.data_info()["validation_tokens"] == 50_000
    (tmp_path / "nano").mkdir()
    ids[:40_000].tofile(tmp_path / "nano" / "train.bin")
    ids[40_000:].tofile(tmp_path / "nano" / "val.bin")
    w = load_workload("gpt", {**GPT_TEXT, "vocab": 300, "data": str(tmp_path / "nano")})
    assert w.data_info()["validation_tokens"] == 10_000


def test_a_users_image_set(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "set.npz", images=rng.random((20, 6, 6)), labels=np.arange(20) % 4)
    w = load_workload("mlp", {"data": str(tmp_path / "set.npz"), "in_features": 36,
                              "hidden": 8, "layers": 1, "out_features": 4})
    x, y = w.batch(3, 0, "cpu")
    assert x.shape == (3, 36) and int(y.max()) < 4
    assert w.eval_batch(4, 0, "cpu")[1].tolist() == [4 % 4, 9 % 4, 14 % 4, 19 % 4]


def test_digits_for_the_vision_workloads():
    pytest.importorskip("sklearn")
    w = load_workload("resnet", {"data": "digits", "widths": [8], "blocks_per_stage": 1,
                                 "image_size": 16})
    x, y = w.batch(5, 0, "cpu")
    assert x.shape == (5, 3, 16, 16) and y.dtype == torch.int64
    assert torch.equal(w.batch(5, 0, "cpu")[0], x)
    info = w.data_info()
    assert (info["train_images"], info["validation_images"]) == (1438, 359)


def test_a_trial_on_real_data_records_its_wait_for_data():
    plan = Plan(name="text", workload="gpt", workload_args=GPT_TEXT, device="cpu",
                micro_batch_size=4, warmup_steps=1, steps=3)
    result = run_trial(prepare(plan, peaks={"fp32": PEAK}), "test")
    assert result.status == "ok", result.reason
    data = result.metrics["data"]
    assert data["loader"] == "dataloader" and data["workers"] >= 1
    assert data["data_wait_s"] >= 0 and 0 <= result.metrics["data_wait_share"] <= 1
    synthetic = plan.replace(workload_args={**GPT_TEXT, "data": "synthetic"})
    result = run_trial(prepare(synthetic, peaks={"fp32": PEAK}), "test")
    assert result.metrics["data"]["loader"] == "pool" and result.metrics["data_wait_s"] == 0
