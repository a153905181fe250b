"""Every model a user brings (issue 25, the Hugging Face part).

- configs are built as transformers builds them, so derived fields follow (qwen2's
  layer_types from num_hidden_layers);
- the estimator's trace falls back where fake tensors cannot follow a forward (to one
  real CPU sample, scaled), and says in one line what stopped it where nothing can;
- mixtures of experts: FLOPs from active parameters, pinned against a hand count; the
  router's loss in the trained loss; checkpointing and bf16 autocast on them; pipeline
  refused with the reason (data parallel and ZeRO 3 are in tests/workloads/run_hf_case.py);
- the zoo: a fixed sample of model types (SAMPLE, about 30 s on 2 CPU cores) held to the
  committed table (tests/zoo_hf.json, written by tests/workloads/zoo_hf.py with the doc's table in
  docs/benchmarks/zoo_hf_cpu_2026-11-24.md); the full sweep is `slow` and runs only with
  HARNESS_ZOO_FULL=1 (1 to 9 min on 2 cores): an ok type stays ok, a refusal is one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.tiny import train
from tests.workloads.tiny_hf import TINY_MOE, needs_transformers
from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Layout, Plan
from training_harness.estimator import estimate
from training_harness.estimator.trace import trace_activations
from training_harness.strategies.compose import reasons_against
from training_harness.workloads import Workload, load_workload
from training_harness.workloads.hf import lm_loss

TABLE = Path(__file__).parent / "zoo_hf.json"
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, seq_len=32)
MIXTRAL = {**TINY, "num_local_experts": 8, "num_experts_per_tok": 2}


@pytest.fixture(scope="module", autouse=True)
def transformers_here():
    needs_transformers()


def test_derived_fields_follow_the_arguments(tmp_path):
    workload = load_workload("hf:qwen2", TINY)
    assert workload.config.layer_types == ["full_attention"] * 2
    # a saved folder: its 28 layer types are derived again for the 3 layers asked for
    load_workload("hf:qwen2", {**TINY, "num_hidden_layers": 28}).config.save_pretrained(tmp_path)
    again = load_workload(f"hf:{tmp_path}", {"num_hidden_layers": 3, "seq_len": 32})
    assert len(again.config.layer_types) == 3 and again.config.hidden_size == 64


def test_mixtral_flops_count_active_experts_by_hand():
    """Mixtral, 2 layers, width 64, 4 heads of 16 (2 kv heads), FFN 128, 8 experts, 2 per
    token, vocab 512, 32 tokens, untied head. Per layer: q, o 64x64 and k, v 64x32 (no
    biases) = 12,288; router 8x64 = 512; experts 8 x (gate_up 256x64 + down 64x128) =
    196,608, of which a token uses 2/8 = 49,152; two RMSNorms 128: 62,080. Two layers
    124,160, final norm 64, LM head 512x64 = 32,768: N = 156,992 active (the embedding
    lookup counted out). Per token 6N = 941,952, attention 12·L·heads·head_dim·T =
    12·2·4·16·32 = 49,152; x 32 tokens = 31,715,328."""
    workload = load_workload("hf:mixtral", MIXTRAL)
    assert workload.flops_per_sample() == 31_715_328
    dense = 156_992 + 196_608 - 49_152  # every expert: what the count was before
    assert workload.flops_per_sample() < (6 * dense + 49_152) * 32


def test_qwen2_moe_flops_count_shared_experts_in_full_by_hand():
    """Qwen2-MoE, the same shapes with 4 experts of FFN 32, 2 per token, and a shared
    expert of FFN 64. Per layer: q 64x64+64, k, v 64x32+32 (biases), o 64x64 = 12,416;
    router 4x64 = 256; experts 4 x (gate_up 64x64 + down 64x32) = 24,576, 2/4 used:
    12,288; shared expert 3 x 64x64 = 12,288 and its gate 64; norms 128: 37,440. N = 2 x
    37,440 + 64 + 32,768 = 107,712; (6N + 49,152) x 32 = 22,253,568."""
    workload = load_workload("hf:qwen2_moe", {
        **TINY, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64})
    assert workload.flops_per_sample() == 22_253_568


def test_the_router_loss_is_in_the_trained_loss_as_transformers_adds_it():
    workload = load_workload("hf:mixtral", MIXTRAL)
    assert workload.config.output_router_logits  # on by default for training
    torch.manual_seed(0)
    model = workload.build_model()
    ids, labels = workload.batch(2, 0, "cpu")
    out = model(input_ids=ids, labels=ids)  # transformers' own: CE + coef x aux
    ours = workload.loss(model, (ids, labels))
    assert out.aux_loss > 0 and model.router_aux_loss_coef == 0.001
    torch.testing.assert_close(ours, lm_loss(out.logits, labels) + 0.001 * out.aux_loss)
    off = load_workload("hf:mixtral", {**MIXTRAL, "output_router_logits": False})
    torch.testing.assert_close(off.loss(model, (ids, labels)), lm_loss(out.logits, labels))


def test_an_encoder_decoder_mixture_trains_with_its_router_losses():
    """Switch Transformers (top-1, experts in a ModuleDict): FLOPs count 1 of 4 experts;
    the loss adds both stacks' z-loss and balance loss as transformers does."""
    workload = load_workload("hf:switch_transformers", dict(
        num_layers=2, num_decoder_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128,
        vocab_size=512, seq_len=32, num_experts=4, encoder_sparse_step=2,
        decoder_sparse_step=2, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        dropout_rate=0.0, router_jitter_noise=0.0))
    torch.manual_seed(0)
    model = workload.build_model()
    from training_harness.workloads.hf_moe import inactive_parameters

    assert inactive_parameters(model, workload.config) == (2 * 65_536 * 3 // 4, None)
    src, decoder, labels = workload.batch(2, 0, "cpu")
    out = model(input_ids=src, decoder_input_ids=decoder, output_router_logits=True)
    routers = 0.001 * (out.encoder_z_loss + out.decoder_z_loss + out.encoder_aux_loss
                       + out.decoder_aux_loss)
    assert routers > 0
    torch.testing.assert_close(workload.loss(model, (src, decoder, labels)),
                               lm_loss(out.logits, labels) + routers)


def test_a_mixture_of_experts_checkpoints_and_autocasts():
    workload = load_workload("hf:mixtral", {**TINY_MOE["mixtral"], "output_router_logits": True})
    base = train({}, workload=workload, steps=2)
    assert train({"checkpoint": {}}, workload=workload, steps=2) == pytest.approx(base, abs=1e-5)
    assert train({"amp": {"dtype": "bf16"}}, workload=workload, steps=1)[0] == pytest.approx(
        base[0], abs=2e-2)


def test_tensor_parallel_splits_a_mixtures_attention_and_keeps_its_experts_whole():
    """transformers >= 5.25 gives Mixtral a tensor plan of its attention alone (the experts
    moved to base_model_ep_plan): the plan is applied, with or without mlp, and the
    experts stay whole on each rank (run on 2 ranks: tests/workloads/run_hf_case.py)."""
    def reasons(tensor: dict) -> list[str]:
        plan = Plan(workload="hf:mixtral", workload_args=MIXTRAL, layout=Layout(tensor=2),
                    global_batch_size=4, micro_batch_size=4, strategies={"tensor": tensor},
                    device="cpu")
        return reasons_against(plan, RuntimeEnv.detect("cpu"))

    config = load_workload("hf:mixtral", MIXTRAL).config
    if any(v not in ("colwise", "rowwise") for v in config.base_model_tp_plan.values()):
        pytest.skip("this transformers puts Mixtral's experts in its tensor plan (< 5.25)")
    assert not any(k.startswith("layers.*.mlp") for k in config.base_model_tp_plan)
    assert reasons({}) == [] and reasons({"mlp": False}) == []


def test_tensor_parallel_refuses_a_plan_style_it_does_not_apply():
    """A tensor plan with a style other than colwise / rowwise (transformers < 5.25 gave
    Mixtral's experts 'moe_tp_experts') is refused in one line."""
    from training_harness.strategies import hf_tensor

    workload = load_workload("hf:mixtral", MIXTRAL)
    workload.config.base_model_tp_plan = {
        "layers.*.self_attn.q_proj": "colwise", "layers.*.mlp.experts": "moe_tp_experts"}
    (why,) = hf_tensor.reasons(workload, 2, mlp=True)
    assert "base_model_tp_plan uses moe_tp_experts" in why and "\n" not in why
    assert hf_tensor.reasons(workload, 2, mlp=False) == []


def test_pipeline_refuses_a_router_loss_it_would_drop():
    plan = Plan(workload="hf:mixtral", workload_args={**MIXTRAL, "tie_word_embeddings": False},
                layout=Layout(pipeline=2), global_batch_size=4, micro_batch_size=2,
                strategies={"pipeline": {}}, device="cpu")
    why = reasons_against(plan, RuntimeEnv.detect("cpu"))
    assert any("router loss (output_router_logits) would be dropped" in w for w in why)


def test_mixtral_is_traced_on_fake_tensors_with_every_expert_resident():
    workload = load_workload("hf:mixtral", MIXTRAL)
    plan = Plan(workload="hf:mixtral", workload_args=MIXTRAL, micro_batch_size=2,
                global_batch_size=2, strategies={"checkpoint": {}}, device="cpu")
    got = estimate(plan, workload, RuntimeEnv.detect("cpu"))
    every = sum(p.numel() for p in workload.build_model().parameters())
    assert got.memory["parameters"] == 4 * every
    assert got.memory["activations"] > 0
    assert not any("Could not trace" in a or "not predicted" in a for a in got.assumptions)


class _Decides(nn.Module):
    """A forward that reads a value (`.item()`): fake tensors and meta cannot follow it."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
            if x.sum().item() > 1e9:  # a data-dependent decision
                x = x * 0
        return x.square().mean()


class _Refuses(_Decides):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("this forward runs nowhere")


def _batch(batch_size: int, index: int, device="cpu"):
    return torch.randn(batch_size, 16, generator=torch.Generator().manual_seed(index)).to(device)


def test_a_forward_fake_tensors_cannot_follow_is_traced_on_one_real_sample_and_scaled():
    workload = Workload.from_callables(_Decides, _batch, name="decides")
    one = trace_activations(workload, 1, False, "cpu")
    eight = trace_activations(workload, 8, False, "cpu")
    assert eight.activations == 8 * one.activations > 0
    (note,) = eight.notes
    assert "traced one real sample on the CPU and scaled" in note and "\n" not in note
    assert "DataDependentOutputException: aten._local_scalar_dense" in note  # .item()
    assert "in forward (tests/test_zoo_hf.py:" in note  # the line that asked for it


def test_a_forward_nothing_can_follow_is_said_in_one_line_and_measured_only():
    workload = Workload.from_callables(_Refuses, _batch, name="refuses")
    plan = Plan(micro_batch_size=4, global_batch_size=4, device="cpu")
    got = estimate(plan, workload, RuntimeEnv.detect("cpu"), flops_per_sample=1.0)
    (note,) = [a for a in got.assumptions if "not predicted" in a]
    assert "NotImplementedError: this forward runs nowhere in forward" in note
    assert "\n" not in note and got.memory["activations"] == 0


T5 = dict(num_layers=2, num_decoder_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128,
          vocab_size=512, seq_len=32, dropout_rate=0.0)


def test_an_encoder_decoder_copies_with_noise():
    workload = load_workload("hf:t5", T5)
    assert workload.source.task == "seq2seq-lm"
    src, decoder, labels = workload.batch(4, 0, "cpu")
    assert torch.equal(decoder[:, 1:], labels[:, :-1]) and (decoder[:, 0] == 0).all()
    changed = (src != labels).sum(1)  # 15% of 32 = 5 positions drawn again per row
    assert (changed <= 5).all() and changed.sum() > 0
    again = workload.batch(4, 0, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(again, (src, decoder, labels), strict=True))


def test_an_encoder_decoder_copies_real_text_too():
    args = {k: v for k, v in T5.items() if k != "vocab_size"}
    workload = load_workload("hf:t5", {**args, "data": "text"})
    assert workload.vocab == 256  # the corpus is bytes
    src, decoder, labels = workload.batch(2, 3, "cpu")
    text = bytes(labels[0].tolist()).decode("latin-1")
    assert text.isprintable() or "\n" in text  # help pages, not the recurrence
    assert torch.equal(decoder[:, 1:], labels[:, :-1]) and (src != labels).any()
    assert workload.loss(workload.build_model(), (src, decoder, labels)).item() > 0


@pytest.mark.parametrize(("model_type", "args", "blocks"), [
    ("t5", T5, "checkpoint (full): 4 of 4 x T5Block"),
    ("bart", dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                  vocab_size=512, seq_len=32, max_position_embeddings=64, dropout=0.0),
     "checkpoint (full): 4 of 4 x BartEncoderLayer + BartDecoderLayer"),
])
def test_an_encoder_decoder_checkpoints_both_stacks(model_type, args, blocks):
    from training_harness.core.plan import Plan as P
    from training_harness.strategies.compose import compose

    workload = load_workload(f"hf:{model_type}", args)
    base = train({}, workload=workload, steps=2)
    assert train({"checkpoint": {}}, workload=workload, steps=2) == pytest.approx(base, abs=1e-5)
    setup = compose(workload.build_model(), P(micro_batch_size=2, global_batch_size=2,
                                              strategies={"checkpoint": {}}), "cpu")
    assert any(n.startswith(blocks) for n in setup.notes), setup.notes


def test_encoder_decoder_flops_count_both_stacks_and_cross_attention():
    """T5 above: N counts the encoder's and decoder's matmul weights and the head (the
    shared embedding counted out: T5 ties it to the head, counted once as the head; the
    two relative-position bias tables, 32 buckets x 4 heads each, are lookups: out);
    attention: encoder self (2 layers), decoder self and cross (2 + 2), each
    12·heads·d_kv·T per token = 12·6·4·16·32 = 147,456."""
    workload = load_workload("hf:t5", T5)
    with torch.device("meta"):
        model = workload.build_model()
    n = sum(p.numel() for p in model.parameters())  # the tied embedding is the head
    assert model.config.tie_word_embeddings
    assert workload.flops_per_sample() == (6 * (n - 2 * 32 * 4) + 147_456) * 32


# The zoo: a fixed sample, held to the committed table.
SAMPLE = ["qwen2", "mixtral", "gpt2", "bert", "mamba", "t5"]


def _table() -> dict[str, dict]:
    return json.loads(TABLE.read_text())


def _held(model_type: str, got, table: dict[str, dict]) -> None:
    assert "\n" not in got.line and got.line, got
    want = table.get(model_type)
    if want is not None and want["status"] == "ok":
        assert got.status == "ok", f"{model_type} worked and now fails: {got.line}"


@pytest.mark.parametrize("model_type", SAMPLE + ["refused"])
def test_zoo_sample_holds_the_table(model_type):
    from tests.workloads.hf_zoo import check

    table = _table()
    if model_type == "refused":  # the first refusal of the table: still one line
        model_type = next(t for t, r in sorted(table.items()) if r["status"] == "refused")
    got = check(model_type, timeout_s=0)
    _held(model_type, got, table)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HARNESS_ZOO_FULL"),
                    reason="the full zoo sweep (1 to 9 min): set HARNESS_ZOO_FULL=1")
def test_full_zoo_holds_the_table():
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
    from zoo_hf import sweep

    from tests.workloads.hf_zoo import Outcome, types

    table = _table()
    rows = sweep(types(), workers=2)
    for name, row in rows.items():
        _held(name, Outcome(**row), table)
