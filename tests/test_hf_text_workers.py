"""A Hugging Face model on real data fed by a worker in a fresh interpreter: a trial's
rank is a fork of the rank server and inherits its start method, so the DataLoader's
worker starts by forkserver and unpickles the workload (transformers' config with it)
in a new process. torchvision's import must be mended there too
(training_harness.core.torchvision_ops, installed by `import harness`), or the worker dies on
`operator torchvision::nms does not exist` where torchvision's compiled ops do not load."""

from __future__ import annotations

import functools
import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader

import training_harness.measure.loader as loader
from tests.test_hf_text import LLAMA
from tests.workloads.tiny_hf import needs_transformers
from training_harness.core.plan import Plan
from training_harness.workloads import load_workload


@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(),
                    reason="no forkserver on this platform")
def test_hf_llama_on_text_trains_a_step_from_a_forkserver_worker(monkeypatch):
    needs_transformers()
    monkeypatch.setattr(loader, "DataLoader",
                        functools.partial(DataLoader, multiprocessing_context="forkserver"))
    workload = load_workload("hf:llama", LLAMA)
    plan = Plan(name="hf-text-worker", workload="hf:llama", workload_args=LLAMA, device="cpu",
                micro_batch_size=2, global_batch_size=2, warmup_steps=0, steps=1)
    feed = loader.LoaderFeed(plan, workload, torch.device("cpu"), data_rank=0, steps=1)
    assert feed.workers >= 1
    try:
        (batch,) = feed(0)  # a dead worker raises here
    finally:
        feed.record(0, None)  # ends the worker
    for got, want in zip(batch, workload.batch(2, 0, "cpu"), strict=True):
        assert torch.equal(got, want)  # the corpus windows of step 0
    torch.manual_seed(0)
    model = workload.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = workload.loss(model, batch)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
