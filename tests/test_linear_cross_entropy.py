"""fused linear_cross_entropy: the LM head and the loss in one, over chunks of tokens
(kernels.linear_cross_entropy). Its claims on the CPU:

- the loss and the gradients w.r.t. the hidden state, the weight and the bias equal
  F.cross_entropy(h @ W.T + b, y)'s in fp32 (relative 1e-5, absolute 1e-6 on the
  gradients; observed <= 1e-7), with ignored rows, at several chunk sizes, a ragged last
  chunk among them; under bf16 autocast within 2e-2 of the fp32 loss;
- the gpt and an hf: llama with it on train as with it off: the same loss and every
  parameter's gradient (tied weights too), a mixture of experts' router loss kept;
- its effect: no tensor saved for backward has tokens x vocab elements (the plain
  path's log-softmax does), and the estimate drops the logits term;
- what it cannot stand in for is refused in one line; each export names its nearest.
(Tensor parallel, ZeRO 3 and the pipeline: tests/distributed's *-linear-ce cases.)
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks

from tests.export import plans as export_plans
from tests.tiny import TINY_GPT, tiny_gpt, train
from tests.workloads.tiny_hf import TINY_HF, TINY_MOE, needs_transformers, tiny_hf
from training_harness.cli.main import main
from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.export import STACKS, export_plan
from training_harness.kernels.linear_cross_entropy import (
    CHUNK_LOGITS_BYTES,
    chunk_rows,
    linear_cross_entropy,
)
from training_harness.strategies.compose import compose, reasons_against
from training_harness.workloads import load_workload

ROOT = Path(__file__).resolve().parent.parent
CPU = RuntimeEnv.detect("cpu")
ON, OFF = {"fused": {"linear_cross_entropy": True}}, {"fused": {}}
EXACT = 1e-4  # on a 5-step training's losses, as tests/test_strategies.py's exact cases


def inputs(n=50, h=24, v=97, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = (0.3 * torch.randn(v, h, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(v, generator=g)).requires_grad_() if bias else None
    targets = torch.randint(v, (n,), generator=g)
    targets[::4] = -100  # ignored rows
    return hidden, weight, b, targets


@pytest.mark.parametrize("rows", [1, 7, 16, 50, 64, None])  # 7, 16: a ragged last chunk
@pytest.mark.parametrize("bias", [True, False])
def test_loss_and_gradients_are_cross_entropys(rows, bias):
    hidden, weight, b, targets = inputs(bias=bias)
    params = [t for t in (hidden, weight, b) if t is not None]
    got = linear_cross_entropy(hidden, weight, targets, b, rows=rows)
    got_grads = torch.autograd.grad(got, params)
    logits = hidden @ weight.T + (b if b is not None else 0)
    want = F.cross_entropy(logits, targets)  # ignore_index -100: the mean over the rest
    want_grads = torch.autograd.grad(want, params)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_grad_output_scales_and_backward_runs_once():
    hidden, weight, b, targets = inputs()
    (3 * linear_cross_entropy(hidden, weight, targets, b, rows=8)).backward(retain_graph=True)
    plain = [t.detach().clone() for t in (hidden, weight, b)]
    for t in (hidden, weight, b):
        t.grad = None
    (3 * F.cross_entropy(hidden @ weight.T + b, targets)).backward()
    for got, t in zip(plain, (hidden, weight, b), strict=True):
        torch.testing.assert_close(got, t.detach())  # the tensors themselves, untouched
    hidden, weight, b, targets = inputs()
    loss = linear_cross_entropy(hidden, weight, targets, b, rows=8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_all_rows_ignored_is_nan_as_torch_with_no_gradient():
    hidden, weight, b, targets = inputs()
    targets[:] = -100
    got = linear_cross_entropy(hidden, weight, targets, b)
    assert torch.isnan(got) and torch.isnan(F.cross_entropy(hidden @ weight.T + b, targets))
    got.backward()
    assert not hidden.grad.any() and not weight.grad.any()


def test_bf16_autocast_is_the_heads():
    hidden, weight, b, targets = inputs()
    want = F.cross_entropy(hidden @ weight.T + b, targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(hidden, weight, targets, b)
    got.backward()
    assert got.dtype == torch.float32 and abs(got.item() - want.item()) < 2e-2
    assert hidden.grad.dtype == weight.grad.dtype == b.grad.dtype == torch.float32


def test_no_gradient_no_work_kept():
    hidden, weight, b, targets = inputs()
    with torch.no_grad():
        got = linear_cross_entropy(hidden, weight, targets, b)
    assert not got.requires_grad
    torch.testing.assert_close(got, F.cross_entropy(hidden @ weight.T + b, targets))


def test_a_chunks_logits_are_bounded():
    rows = chunk_rows(50304)  # GPT-2's vocabulary (padded)
    assert rows == 1280 and rows * 50304 * 4 <= CHUNK_LOGITS_BYTES
    assert chunk_rows(50304, rows=100) == 100 and chunk_rows(2**30) == 1
    assert chunk_rows(64) * 64 * 4 <= CHUNK_LOGITS_BYTES


def loss_and_grads(workload, strategies, amp=False):
    torch.manual_seed(0)
    model = workload.build_model()
    plan = {**strategies, **({"amp": {"dtype": "bf16"}} if amp else {})}
    setup = compose(model, Plan(strategies=plan, device="cpu"), "cpu")
    with setup.autocast():
        loss = workload.loss(setup.model, workload.batch(8, 0, "cpu"))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in setup.model.named_parameters()}, setup


@pytest.mark.parametrize("tied", [True, False])
def test_the_gpt_loss_and_every_gradient_are_the_plain_ones(tied):
    workload = tiny_gpt(tie_weights=tied, vocab=96)
    want, want_grads, _ = loss_and_grads(workload, OFF)
    got, got_grads, setup = loss_and_grads(workload, ON)
    assert "criterion -> linear cross-entropy" in setup.notes[0]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert got_grads.keys() == want_grads.keys()
    for name, g in got_grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    # under bf16 autocast: the head's matmuls in bf16 both ways
    want, _, _ = loss_and_grads(workload, OFF, amp=True)
    got, _, _ = loss_and_grads(workload, ON, amp=True)
    assert abs(got.item() - want.item()) < 2e-2


def test_the_gpt_trains_as_without_it():
    plain, fused = train(OFF), train(ON)
    assert max(abs(a - b) for a, b in zip(plain, fused, strict=True)) <= EXACT  # obs. 5e-7
    assert fused[-1] < fused[0]


@pytest.fixture
def transformers_here():
    needs_transformers()


@pytest.mark.usefixtures("transformers_here")
@pytest.mark.parametrize("tied", [False, True])
def test_an_hf_llama_loss_and_every_gradient_are_the_plain_ones(tied):
    workload = load_workload("hf:llama", {**TINY_HF["llama"], "tie_word_embeddings": tied})
    want, want_grads, _ = loss_and_grads(workload, OFF)
    got, got_grads, setup = loss_and_grads(workload, ON)
    assert "linear cross-entropy" in setup.notes[0]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for name, g in got_grads.items():
        torch.testing.assert_close(g, want_grads[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.usefixtures("transformers_here")
def test_hf_trains_as_without_it_and_a_moe_keeps_its_router_loss():
    llama = tiny_hf("llama")
    assert max(abs(a - b) for a, b in zip(train(OFF, workload=llama),
                                           train(ON, workload=llama), strict=True)) <= EXACT
    moe = load_workload("hf:mixtral", {**TINY_MOE["mixtral"], "output_router_logits": True})
    plain, fused = train(OFF, workload=moe), train(ON, workload=moe)
    assert max(abs(a - b) for a, b in zip(plain, fused, strict=True)) <= EXACT


def saved(workload, strategies) -> list[torch.Size]:
    """The shapes of what autograd saves in one training forward (parameters too)."""
    torch.manual_seed(0)
    setup = compose(workload.build_model(), Plan(strategies=strategies, device="cpu"), "cpu")
    shapes: list[torch.Size] = []

    def pack(t):
        shapes.append(t.shape)
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        workload.loss(setup.model, workload.batch(8, 0, "cpu"))
    return shapes


def test_no_saved_tensor_is_tokens_by_vocab(transformers_here):
    for workload, vocab in ((tiny_gpt(vocab=512), 512),
                            (load_workload("hf:llama", {**TINY_HF["llama"], "vocab_size": 512}),
                             512)):
        tokens = 8 * 16
        logits = tokens * vocab
        plain, fused = saved(workload, OFF), saved(workload, ON)
        assert any(s.numel() >= logits for s in plain)  # the log-softmax's output, at least
        assert max(s.numel() for s in fused) < logits, sorted(fused, key=lambda s: -s.numel())
        # what it keeps instead: the hidden state's and the weight's gradients
        assert torch.Size([tokens, 32]) in fused and torch.Size([vocab, 32]) in fused


def reasons(workload="gpt", args=None, **fused):
    args = dict(TINY_GPT) if args is None and workload == "gpt" else (args or {})
    extra = fused.pop("strategies", {})
    plan = Plan(workload=workload, workload_args=args, device="cpu",
                strategies={"fused": {"linear_cross_entropy": True, **fused}, **extra})
    return reasons_against(plan, CPU)


def test_what_it_cannot_stand_in_for_is_refused_in_one_line(transformers_here):
    assert reasons() == []
    assert reasons("hf:llama", TINY_HF["llama"]) == []
    cases = {
        "not 'mlp'": reasons("mlp", {}),
        "'hf:bert' is a masked LM": reasons("hf:bert", TINY_HF["bert"]),
        "an encoder-decoder": reasons("hf:t5", {"num_layers": 1, "d_model": 16, "d_ff": 32,
                                                 "num_heads": 2, "d_kv": 8, "vocab_size": 64}),
        "final_logit_softcapping": reasons("hf:gemma2", {
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
            "vocab_size": 64}),
        "cross_entropy = 'triton' has no logits": reasons(cross_entropy="triton"),
        "the student's whole logits": reasons(strategies={"distill": {"teacher": "x"}}),
    }
    for needle, got in cases.items():
        line = next((r for r in got if needle in r), None)
        assert line is not None and "\n" not in line, (needle, got)
        assert "set " in line  # what to change


def gpt2_small_estimate(tmp_path, capsys, on: bool) -> dict:
    workload = tomllib.loads((ROOT / "studies/gpt2-small-1gpu.toml").read_text())["workload"]
    fused = "\nlinear_cross_entropy = true" if on else ""
    plan = tmp_path / f"gpt2-{on}.toml"
    plan.write_text(
        "device = 'cuda'\nmicro_batch_size = 64\nglobal_batch_size = 64\n[workload]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in workload.items())
        + f"[strategies.amp]\ndtype = 'bf16'\n[strategies.fused]\nattention = 'sdpa'{fused}\n")
    capsys.readouterr()
    assert main(["estimate", str(plan), "--target", "h100-sxm-80gb", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_estimate_drops_the_logits(tmp_path, capsys):
    """GPT-2 small at micro-batch 64 (the study's workload), bf16 + SDPA on an H100: the
    logits term (12·b·s·V = 39.6 GB) falls to one chunk and the weight's gradient
    (0.54 GB); the peak, 64.2 GB without, by more than 20 GB (observed 39 GB)."""
    plain = gpt2_small_estimate(tmp_path, capsys, False)
    fused = gpt2_small_estimate(tmp_path, capsys, True)
    assert plain["memory"]["logits"] > 30e9 and fused["memory"]["logits"] < 1e9
    assert plain["peak_memory_bytes"] - fused["peak_memory_bytes"] > 20e9
    assert any("fused linear cross-entropy" in a and "never holds" in a
               for a in fused["assumptions"])


@pytest.mark.parametrize("stack", STACKS)
def test_each_export_names_its_nearest(stack):
    p = export_plans.plan({"amp": {"dtype": "bf16"}, "fused": {"linear_cross_entropy": True}})
    exp = export_plan(p, stack, "t")
    (named,) = [n for n in exp.not_expressed if n.setting == "fused.linear_cross_entropy = true"]
    assert ("liger" in named.nearest.lower()) or (stack == "torchtitan"
                                                   and named.nearest.startswith("none"))
