"""fused's attention backends: SDPA's kernel as a setting (sdpa_backend) and
FlexAttention (attention = "flex"). Claims on the CPU: each backend that runs here gives
the explicit attention's loss and gradients (tiny GPT, 1e-5); the backend named is the
one that ran (torch's profiler names the aten kernel); flex's causal block mask gives
SDPA's causal output; a backend or kind the device lacks is refused in one line; the
estimator keeps the scores for math only."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import profile

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.estimator import estimate
from training_harness.measure.batches import split_batch
from training_harness.strategies.attention_backends import cpu_backends
from training_harness.strategies.compose import compose, reasons_against
from training_harness.workloads import load_workload
from training_harness.workloads.attention import FlexAttention, SdpaAttention, swap_attention

GPT = {"layers": 2, "heads": 2, "hidden": 32, "seq_len": 32, "vocab": 64}
CPU = RuntimeEnv.detect("cpu")
# the aten kernel each backend runs on the CPU (forward)
KERNEL = {"math": "aten::_scaled_dot_product_attention_math",
          "flash": "aten::_scaled_dot_product_flash_attention_for_cpu"}


def plan(fused: dict, args: dict | None = None, **strategies) -> Plan:
    return Plan(workload="gpt", workload_args={**GPT, **(args or {})}, micro_batch_size=4,
                global_batch_size=4, strategies={"fused": fused, **strategies}, device="cpu")


def gradients(fused: dict) -> tuple[float, dict[str, torch.Tensor]]:
    workload = load_workload("gpt", GPT)
    torch.manual_seed(0)
    setup = compose(workload.build_model(), plan({"optimizer": "default", **fused}), "cpu")
    batch = workload.batch(4, 0, "cpu")
    with setup.step_contexts[0]() if setup.step_contexts else torch.enable_grad():
        loss = workload.loss(setup.model, batch)
        loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in setup.model.named_parameters()}


def test_the_backends_that_run_here_are_probed():
    assert {"math", "flash"} <= cpu_backends(False)  # torch 2.13's CPU: math and flash
    assert "efficient" not in cpu_backends(False) and "cudnn" not in cpu_backends(False)
    assert "flash" not in cpu_backends(True)  # the CPU flash kernel takes no dropout


@pytest.mark.parametrize("backend", sorted(cpu_backends(False)))
def test_each_backend_gives_the_explicit_loss_and_gradients(backend):
    loss, grads = gradients({"attention": "explicit"})
    mine, got = gradients({"attention": "sdpa", "sdpa_backend": backend})
    assert mine == pytest.approx(loss, abs=1e-5)  # observed <= 1e-6
    for name, g in grads.items():
        torch.testing.assert_close(got[name], g, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_the_named_backend_is_the_one_that_runs(backend):
    workload = load_workload("gpt", GPT)
    setup = compose(workload.build_model(), plan({"sdpa_backend": backend}), "cpu")
    with profile() as prof:
        setup.step(split_batch(workload.batch(4, 0, "cpu"), 1), workload.loss)
    ran = {e.key for e in prof.key_averages()}
    assert KERNEL[backend] in ran
    assert not {k for b, k in KERNEL.items() if b != backend} & ran
    assert any("SDPA backend" in n for n in setup.notes)


def test_the_backend_reaches_transformers_own_sdpa_calls():
    pytest.importorskip("transformers")
    args = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
            "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64,
            "seq_len": 16}
    workload = load_workload("hf:llama", args)
    for backend in ("math", "flash"):
        p = Plan(workload="hf:llama", workload_args=args, micro_batch_size=2,
                 global_batch_size=2, device="cpu", strategies={"fused": {
                     "sdpa_backend": backend}})
        setup = compose(workload.build_model(), p, "cpu")
        with profile() as prof:
            setup.step(split_batch(workload.batch(2, 0, "cpu"), 1), workload.loss)
        ran = {e.key for e in prof.key_averages()}
        assert KERNEL[backend] in ran
        assert not {k for b, k in KERNEL.items() if b != backend} & ran


def test_auto_adds_no_step_context():
    setup = compose(load_workload("gpt", GPT).build_model(), plan({}), "cpu")
    assert setup.step_contexts == []


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_causal_equals_sdpa_causal():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 160, 8) for _ in range(3))  # two flex blocks, one partial
    with torch.no_grad():  # torch 2.13's FlexAttention has no CPU backward
        torch.testing.assert_close(FlexAttention()(q, k, v), SdpaAttention()(q, k, v),
                                   atol=1e-5, rtol=1e-5)


def test_flex_is_swapped_in():  # compose refuses it on the CPU: the swap itself
    model = load_workload("gpt", GPT).build_model()
    assert swap_attention(model, "flex") == GPT["layers"]
    assert sum(isinstance(m, FlexAttention) for m in model.modules()) == GPT["layers"]


@pytest.mark.parametrize(("fused", "args", "words"), [
    ({"sdpa_backend": "efficient"}, None, "does not run on this CPU"),
    ({"sdpa_backend": "cudnn"}, None, "does not run on this CPU"),
    ({"sdpa_backend": "flash"}, {"dropout": 0.1}, "with attention dropout"),
    ({"attention": "explicit", "sdpa_backend": "math"}, None, "calls no SDPA"),
    ({"attention": "flex"}, None, "no backward on the CPU"),
    ({"attention": "flex"}, {"dropout": 0.1}, "no attention dropout"),
])
def test_what_cannot_run_is_refused_in_one_line(fused, args, words):
    reasons = reasons_against(plan(fused, args), CPU)
    assert any(words in r for r in reasons), reasons
    assert all("\n" not in r for r in reasons)


def test_math_and_flash_run_here():
    for backend in ("math", "flash"):
        assert reasons_against(plan({"sdpa_backend": backend}), CPU) == []


def test_cuda_needs_ampere_and_16_bit_for_flash_and_cudnn(monkeypatch):
    from training_harness.strategies import attention_backends

    cuda = RuntimeEnv("cuda", "a GPU", 1, True, True)
    monkeypatch.setattr(attention_backends, "cuda_capability", lambda: (7, 0))
    assert any("8.0 or newer" in r for r in reasons_against(plan({"sdpa_backend": "flash"}),
                                                             cuda))
    monkeypatch.setattr(attention_backends, "cuda_capability", lambda: (9, 0))
    assert any("fp16/bf16" in r for r in reasons_against(plan({"sdpa_backend": "cudnn"}), cuda))
    assert reasons_against(plan({"sdpa_backend": "cudnn"}, amp={"dtype": "bf16"}), cuda) == []
    assert reasons_against(plan({"sdpa_backend": "efficient"}), cuda) == []
    assert reasons_against(plan({"attention": "flex"}), cuda) == []


def test_flex_on_an_hf_model_without_it_is_refused():
    pytest.importorskip("transformers")
    cuda = RuntimeEnv("cuda", "a GPU", 1, True, True)
    gpt2 = Plan(workload="hf:gpt2", workload_args={"n_layer": 1, "n_embd": 32, "n_head": 2,
                                                   "vocab_size": 64, "seq_len": 16},
                micro_batch_size=2, global_batch_size=2, device="cpu",
                strategies={"fused": {"attention": "flex"}})
    llama = gpt2.replace(workload="hf:llama", workload_args={
        "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "seq_len": 16})
    assert reasons_against(llama, cuda) == []
    reasons = reasons_against(gpt2, cuda)  # transformers 5's GPT-2 has no flex support
    assert any("no FlexAttention in transformers" in r for r in reasons), reasons
    assert all("\n" not in r for r in reasons)


def test_the_estimate_keeps_the_scores_for_math_only():
    workload = load_workload("gpt", GPT)
    terms = {b: estimate(plan({"sdpa_backend": b}), workload, CPU).block_terms
             for b in ("auto", "math", "flash")}
    assert terms["math"]["softmax_output"] > 0
    assert "softmax_output" not in terms["flash"] and "softmax_output" not in terms["auto"]
    flex = estimate(plan({"attention": "flex"}), workload, CPU).block_terms
    assert "softmax_output" not in flex and flex["logsumexp"] > 0
    said = estimate(plan({"sdpa_backend": "math"}), workload, CPU).assumptions
    assert any("backend 'math'" in a for a in said)


@pytest.mark.parametrize("stack", ["hf-trainer", "accelerate", "lightning", "torchtitan",
                                   "deepspeed"])
def test_each_export_names_the_backend_and_flex(stack):
    from tests.export import plans
    from training_harness.core.errors import HarnessError
    from training_harness.export import export_plan

    for fused, words in (({"sdpa_backend": "flash"}, "fused.sdpa_backend"),
                         ({"attention": "flex"}, "fused.attention = flex")):
        try:
            exp = export_plan(plans.plan({"fused": fused}), stack, "test")
        except HarnessError as e:  # nothing carried: the refusal names what was lost
            assert words in str(e)
            continue
        lost = [n.setting for n in exp.not_expressed]
        carried = stack == "hf-trainer" and "attention" in fused  # attn_implementation
        assert carried or any(words in s for s in lost), lost
    trainer = export_plan(plans.plan({"fused": {"attention": "flex"}}), "hf-trainer", "test")
    assert '"flex_attention"' in trainer.sidecar()
