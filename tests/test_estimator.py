"""The estimator: exact state bytes, the per-term activation formula against the
paper and against what torch saves on this CPU, the traced path, step time."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.device import RuntimeEnv
from harness.errors import HarnessError
from harness.estimator import (
    COMPONENTS,
    PAPER,
    block_activation_terms,
    estimate,
    korthikanti_bytes,
    rebuild_moment,
    widths_for,
)
from harness.plan import Layout, Plan
from harness.workloads.attention import ATTENTION
from harness.workloads.base import TransformerShape, Workload

CPU = RuntimeEnv("cpu", "test cpu", 1, bf16=True, triton=False)
CUDA = RuntimeEnv("cuda", "test gpu", 1, bf16=True, triton=False)


# --- a small GPT, local to the tests ------------------------------------------------


class Block(nn.Module):
    """Pre-LayerNorm GPT block, nanoGPT-style, with the harness's swappable attention cores."""

    def __init__(self, h: int, a: int, dropout: float, attention: str) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2, self.gelu = nn.Linear(h, 4 * h), nn.Linear(4 * h, h), nn.GELU()
        self.attention = ATTENTION[attention](dropout=dropout)
        self.resid_drop, self.mlp_drop = nn.Dropout(dropout), nn.Dropout(dropout)
        self.a = a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (
            t.view(b, s, self.a, h // self.a).transpose(1, 2)
            for t in self.qkv(self.ln1(x)).split(h, dim=2)
        )
        y = self.attention(q, k, v)
        x = x + self.resid_drop(self.proj(y.transpose(1, 2).contiguous().view(b, s, h)))
        return x + self.mlp_drop(self.fc2(self.gelu(self.fc1(self.ln2(x)))))


class TinyGPT(nn.Module):
    def __init__(self, shape: TransformerShape, attention: str) -> None:
        super().__init__()
        h = shape.hidden
        self.wte, self.wpe = nn.Embedding(shape.vocab, h), nn.Embedding(shape.seq_len, h)
        self.drop = nn.Dropout(shape.dropout)
        self.blocks = nn.ModuleList(
            Block(h, shape.heads, shape.dropout, attention) for _ in range(shape.layers)
        )
        self.ln_f, self.head = nn.LayerNorm(h), nn.Linear(h, shape.vocab, bias=False)
        self.head.weight = self.wte.weight  # tied: counted once

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class TinyGPTWorkload(Workload):
    name = "tiny-gpt"

    def __init__(
        self,
        layers: int = 2,
        hidden: int = 64,
        heads: int = 4,
        seq_len: int = 32,
        vocab: int = 300,
        dropout: float = 0.0,
        attention: str = "explicit",
    ) -> None:
        self.shape = TransformerShape(
            layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab,
            ffn_hidden=4 * hidden, dropout=dropout,
        )
        self.attention = attention
        self.tokens_per_sample = seq_len

    def build_model(self) -> nn.Module:
        return TinyGPT(self.shape, self.attention)

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> tuple:
        g = torch.Generator().manual_seed(index)
        data = torch.randint(0, self.shape.vocab, (batch_size, self.shape.seq_len + 1), generator=g)
        return data[:, :-1].to(device), data[:, 1:].to(device)

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        idx, targets = batch
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_sample(self) -> float:
        s = self.shape
        n = 12 * s.layers * s.hidden**2
        return s.seq_len * (6 * n + 12 * s.layers * s.hidden * s.seq_len)


def gpt_plan(attention: str = "explicit", micro_batch: int = 4, **strategies: dict) -> Plan:
    return Plan(
        workload="tiny-gpt",
        workload_args={"attention": attention},
        micro_batch_size=micro_batch,
        strategies=strategies,
    )


def expected_parameters(w: TinyGPTWorkload) -> int:
    s = w.shape
    h = s.hidden
    block = 12 * h * h + 13 * h  # LN 2h, QKV 3h²+3h, proj h²+h, LN 2h, FC 4h²+4h, FC 4h²+h
    return s.vocab * h + s.seq_len * h + s.layers * block + 2 * h  # tied head once; ln_f


# --- parameters, gradients, optimizer state --------------------------------------------


@pytest.mark.parametrize("strategies", [{}, {"amp": {}}, {"lamb": {}}])
def test_state_is_4_4_8_bytes_per_unique_parameter(strategies):
    w = TinyGPTWorkload()
    psi = expected_parameters(w)
    e = estimate(gpt_plan(**strategies), w, CPU)
    assert e.memory["parameters"] == 4 * psi
    assert e.memory["gradients"] == 4 * psi
    assert e.memory["optimizer_state"] == 8 * psi


def test_frozen_parameters_have_no_gradients_or_moments():
    class Frozen(TinyGPTWorkload):
        def build_model(self) -> nn.Module:
            model = super().build_model()
            model.wpe.weight.requires_grad_(False)
            return model

    w = Frozen()
    e = estimate(gpt_plan(), w, CPU)
    frozen = w.shape.seq_len * w.shape.hidden
    assert e.memory["parameters"] == 4 * expected_parameters(w)
    assert e.memory["gradients"] == 4 * (expected_parameters(w) - frozen)


# --- the per-term activation formula -----------------------------------------------------

SHAPE = TransformerShape(layers=4, hidden=256, heads=8, seq_len=512, vocab=1000, ffn_hidden=1024)


def test_paper_setting_gives_korthikanti_eq1():
    s, b, h, a = SHAPE.seq_len, 3, SHAPE.hidden, SHAPE.heads
    terms = block_activation_terms(SHAPE, b, PAPER, attention="explicit", dropout=True)
    assert sum(terms.values()) == 34 * s * b * h + 5 * a * s * s * b
    assert sum(terms.values()) == korthikanti_bytes(SHAPE, b)


def test_no_dropout_drops_masks_and_dropout_output():
    s, b, h, a = SHAPE.seq_len, 3, SHAPE.hidden, SHAPE.heads
    terms = block_activation_terms(SHAPE, b, PAPER, attention="explicit", dropout=False)
    assert sum(terms.values()) == 32 * s * b * h + 2 * a * s * s * b


def test_sdpa_drops_the_s_squared_terms():
    s, b, h, a = SHAPE.seq_len, 3, SHAPE.hidden, SHAPE.heads
    fused = block_activation_terms(SHAPE, b, PAPER, attention="fused", dropout=True)
    # Q, K, V and the output as before, no scores: only a fp32 log-sum-exp per row and head.
    assert sum(fused.values()) == 34 * s * b * h + 4 * a * s * b
    longer = TransformerShape(**{**SHAPE.__dict__, "seq_len": 2 * s})
    doubled = block_activation_terms(longer, b, PAPER, attention="fused", dropout=True)
    assert sum(doubled.values()) == 2 * sum(fused.values())  # linear in s


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bf16_halves_the_16_bit_terms(device):
    fp32 = block_activation_terms(SHAPE, 2, widths_for(False, device), dropout=True)
    bf16 = block_activation_terms(SHAPE, 2, widths_for(True, device), dropout=True)
    for term in ("qkv_input", "q_and_k", "v", "proj_input", "fc1_input", "gelu_input", "fc2_input"):
        assert bf16[term] * 2 == fp32[term], term
    # The residual stream stays fp32 under autocast: LayerNorm inputs keep 4 bytes.
    assert bf16["ln1_input"] == fp32["ln1_input"] == 4 * SHAPE.seq_len * 2 * SHAPE.hidden
    if device == "cuda":  # softmax in fp32 and bool dropout masks under CUDA autocast
        assert bf16["softmax_output"] == fp32["softmax_output"]
        assert bf16["residual_dropout_mask"] == fp32["residual_dropout_mask"]


def test_estimate_activations_are_blocks_times_terms():
    w = TinyGPTWorkload(layers=3)
    e = estimate(gpt_plan(), w, CPU)
    assert e.memory["activations"] == 3 * sum(e.block_terms.values())
    s, b, v = w.shape.seq_len, 4, w.shape.vocab
    assert e.memory["logits"] == 12 * b * s * v


def test_checkpointing_every_block_keeps_only_block_inputs():
    w = TinyGPTWorkload(layers=4)
    s, b, h = w.shape.seq_len, 4, w.shape.hidden
    full = estimate(gpt_plan(), w, CPU)
    every1 = estimate(gpt_plan(checkpoint={}), w, CPU)
    every2 = estimate(gpt_plan(checkpoint={"every": 2}), w, CPU)
    per_block = sum(full.block_terms.values())
    assert every1.memory["activations"] == 4 * (4 * s * b * h)  # fp32 residual inputs
    assert every1.memory["recompute"] == per_block - full.block_terms["ln1_input"]
    assert every2.memory["activations"] == 2 * (4 * s * b * h) + 2 * per_block
    assert every1.memory["activations"] < every2.memory["activations"] < full.memory["activations"]
    assert full.memory["recompute"] == 0
    # The recompute adds one forward of each checkpointed block.
    block_fwd = s * (2 * (12 * h * h + 13 * h) + 4 * h * s)
    extra = every1.flops_per_step - full.flops_per_step
    assert extra == pytest.approx(4 * block_fwd * b)


def test_rebuilding_an_early_block_meets_the_most_gradients():
    # Three checkpointed blocks keeping 1 byte each, 10 bytes of parameters each,
    # 5 more outside. Rebuilding block 0 meets every gradient but its own
    # predecessors' (none): 1 + 35; block 2 meets 3 bytes of activations + 15.
    assert rebuild_moment([1, 1, 1], [10, 10, 10], [0, 1, 2], 35, held=0) == 36
    assert rebuild_moment([100, 1, 1], [10, 10, 10], [2], 35, held=0) == 102 + 15
    assert rebuild_moment([1, 1, 1], [10, 10, 10], [2], 35, held=35) == 3 + 35  # accumulation


def test_sdpa_setting_removes_s_squared_terms_from_the_estimate():
    w = TinyGPTWorkload(seq_len=64)
    explicit = estimate(gpt_plan("explicit"), w, CUDA)
    fused = estimate(gpt_plan("explicit", fused={"attention": "sdpa"}), w, CUDA)
    assert "softmax_output" in explicit.block_terms and "softmax_output" not in fused.block_terms
    assert fused.memory["activations"] < explicit.memory["activations"]
    back = estimate(gpt_plan("sdpa", fused={"attention": "explicit"}), TinyGPTWorkload(), CUDA)
    assert "softmax_output" in back.block_terms  # the swap goes both ways


def test_chunked_cross_entropy_holds_only_the_logits():
    w = TinyGPTWorkload()
    s, v = w.shape.seq_len, w.shape.vocab
    eager = estimate(gpt_plan(amp={}), w, CUDA)
    chunked = estimate(gpt_plan(amp={}, fused={"cross_entropy": "triton"}), w, CUDA)
    assert eager.memory["logits"] == 12 * 4 * s * v
    assert chunked.memory["logits"] == 2 * 4 * s * v  # bf16 logits, gradient written over them


def test_amp_lowers_activations_and_adds_weight_copies():
    w = TinyGPTWorkload()
    fp32 = estimate(gpt_plan(), w, CUDA)
    amp = estimate(gpt_plan(amp={"dtype": "bf16"}), w, CUDA)
    assert amp.memory["activations"] < fp32.memory["activations"]
    assert amp.memory["autocast_weight_copies"] == 2 * expected_parameters(w)
    assert fp32.memory["autocast_weight_copies"] == 0


# --- against what torch saves on this CPU -------------------------------------------------


def saved_bytes(model: nn.Module, run, amp: bool) -> dict[str, int]:
    """Run forward for real, counting what autograd saves once per storage, by place."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    blocks = list(getattr(model, "blocks", []))
    current: list[int] = []

    def leave(_m: nn.Module, _args: object, _out: object) -> None:
        current.pop()

    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda _m, _a, i=i: current.append(i))
        block.register_forward_hook(leave)
    seen: dict[int, str] = {}
    sizes: dict[int, int] = {}
    held = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        held.append(t)
        key = t.untyped_storage().data_ptr()
        if key in params or key in seen:
            return t
        # autocast's copy of a parameter: a cast whose next node accumulates a leaf
        node = t.grad_fn
        while node is not None and type(node).__name__.startswith(("TBackward", "View")):
            node = node.next_functions[0][0]
        is_copy = (
            node is not None
            and type(node).__name__.startswith("ToCopyBackward")
            and isinstance(getattr(node.next_functions[0][0], "variable", None), nn.Parameter)
        )
        seen[key] = "copies" if is_copy else ("blocks" if current else "outside")
        sizes[key] = t.untyped_storage().nbytes()
        return t

    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp),
    ):
        run()
    out = {"copies": 0, "blocks": 0, "outside": 0}
    for key, where in seen.items():
        out[where] += sizes[key]
    return out


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("amp", [False, True])
def test_transformer_terms_match_what_torch_saves_on_cpu(attention, dropout, amp):
    w = TinyGPTWorkload(layers=2, dropout=dropout, attention=attention)
    plan = gpt_plan(attention, micro_batch=3, **({"amp": {}} if amp else {}))
    e = estimate(plan, w, CPU)
    torch.manual_seed(0)
    model = w.build_model()
    batch = w.batch(3, 0, "cpu")
    measured = saved_bytes(model, lambda: w.loss(model, batch), amp)
    # Left out by the formula: one s x s bool causal mask per block (explicit attention).
    assert e.memory["activations"] == pytest.approx(measured["blocks"], rel=0.01)


class TinyClassifier(TinyGPTWorkload):
    """The same blocks with a head on the first token only: no per-token loss, so the
    estimate traces what lies outside the blocks."""

    def __init__(self, classes: int = 10, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tokens_per_sample = None
        self.classes = classes

    def build_model(self) -> nn.Module:
        model = super().build_model()
        model.head = nn.Linear(self.shape.hidden, self.classes)
        return model

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        idx, targets = batch
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = model.drop(model.wte(idx) + model.wpe(pos))
        for block in model.blocks:
            x = block(x)
        return F.cross_entropy(model.head(model.ln_f(x[:, 0])), targets[:, 0] % self.classes)


@pytest.mark.parametrize("amp", [False, True])
def test_a_classifier_head_is_traced_not_taken_for_a_language_model(amp):
    w = TinyClassifier(attention="sdpa")
    e = estimate(gpt_plan("sdpa", micro_batch=3, **({"amp": {}} if amp else {})), w, CPU)
    assert e.memory["logits"] == 0
    assert "qkv_output" in e.block_terms  # the model's SDPA core, seen through the swap
    torch.manual_seed(0)
    model = w.build_model()
    batch = w.batch(3, 0, "cpu")
    measured = saved_bytes(model, lambda: w.loss(model, batch), amp)
    assert e.memory["activations"] == pytest.approx(measured["blocks"], rel=0.01)
    assert e.memory["other_activations"] == measured["outside"]


class MLP(Workload):
    """Linear, GELU, Linear with an MSE loss; no `shape`, so the estimate traces it."""

    name = "mlp"

    def __init__(self, d_in: int = 24, hidden: int = 96, d_out: int = 10) -> None:
        self.d_in, self.hidden, self.d_out = d_in, hidden, d_out

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(self.d_in, self.hidden), nn.GELU(), nn.Linear(self.hidden, self.d_out)
        )

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> tuple:
        g = torch.Generator().manual_seed(index)
        x = torch.randn(batch_size, self.d_in, generator=g)
        y = torch.randn(batch_size, self.d_out, generator=g)
        return x.to(device), y.to(device)

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(model(x), y)


def test_traced_mlp_matches_a_hand_count():
    w, b = MLP(), 5
    e = estimate(Plan(workload="mlp", micro_batch_size=b), w, CPU)
    # fp32: the input (for FC1's weight gradient), GELU's input, FC2's input (GELU's
    # output), MSE's input and target. FC1 keeps no weight: its input needs no gradient.
    assert e.memory["activations"] == 4 * b * (w.d_in + 2 * w.hidden + 2 * w.d_out)
    amp = estimate(Plan(workload="mlp", micro_batch_size=b, strategies={"amp": {}}), w, CPU)
    # bf16 input copy, GELU input and output; MSE runs in fp32 (its input cast up).
    assert amp.memory["activations"] == 2 * b * (w.d_in + 2 * w.hidden) + 4 * b * 2 * w.d_out
    assert amp.memory["autocast_weight_copies"] == 2 * w.hidden * w.d_out  # FC2's weight


@pytest.mark.parametrize("amp", [False, True])
def test_traced_mlp_within_10_percent_of_a_real_cpu_forward(amp):
    w, b = MLP(d_in=64, hidden=256, d_out=16), 32
    plan = Plan(workload="mlp", micro_batch_size=b, strategies={"amp": {}} if amp else {})
    e = estimate(plan, w, CPU)
    torch.manual_seed(0)
    model = w.build_model()
    batch = w.batch(b, 0, "cpu")
    measured = saved_bytes(model, lambda: w.loss(model, batch), amp)
    assert e.memory["activations"] == pytest.approx(measured["outside"], rel=0.10)
    assert e.memory["autocast_weight_copies"] == pytest.approx(measured["copies"], rel=0.10)


def test_traced_layernorm_is_fp32_under_cuda_autocast():
    class Normed(MLP):
        def build_model(self) -> nn.Module:
            return nn.Sequential(
                nn.Linear(self.d_in, self.hidden), nn.LayerNorm(self.hidden),
                nn.Linear(self.hidden, self.d_out),
            )

    w, b = Normed(), 5
    plan = Plan(workload="mlp", micro_batch_size=b, strategies={"amp": {}})
    cpu, cuda = estimate(plan, w, CPU), estimate(plan, w, CUDA)
    # CUDA autocast runs LayerNorm in fp32: its input (and mean, rstd) take 4 bytes, not 2.
    assert cuda.memory["activations"] - cpu.memory["activations"] == 2 * b * w.hidden + 2 * b * 2


def test_traced_checkpointing_keeps_block_inputs():
    class Deep(MLP):
        def build_model(self) -> nn.Module:
            model = nn.Module()
            model.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(self.hidden, self.hidden), nn.GELU()) for _ in range(3)
            )
            model.inp, model.out = nn.Linear(self.d_in, self.hidden), nn.Linear(self.hidden, 10)

            def forward(x: torch.Tensor) -> torch.Tensor:
                x = model.inp(x)
                for block in model.blocks:
                    x = block(x)
                return model.out(x)

            model.forward = forward
            return model

    w, b = Deep(), 4
    full = estimate(Plan(workload="mlp", micro_batch_size=b), w, CPU)
    ckpt = estimate(Plan(workload="mlp", micro_batch_size=b, strategies={"checkpoint": {}}), w, CPU)
    # A block saves its input (for the weight gradient) and GELU's input: 2·b·hidden fp32.
    assert full.memory["activations"] == 3 * 2 * 4 * b * w.hidden
    assert ckpt.memory["activations"] == 3 * 4 * b * w.hidden
    assert ckpt.memory["recompute"] == 4 * b * w.hidden  # GELU's input, rebuilt
    assert ckpt.flops_per_step == pytest.approx(full.flops_per_step + 3 * 2 * w.hidden**2 * b)


# --- a whole step against a live-memory count on CPU ---------------------------------------


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Peak bytes of the storages created inside the mode that are still alive."""

    def __init__(self, exclude: set[int]) -> None:
        super().__init__()
        from torch.multiprocessing.reductions import StorageWeakRef

        self.ref, self.exclude, self.live, self.peak = StorageWeakRef, exclude, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live and key not in self.exclude:
                    self.live[key] = (self.ref(storage), storage.nbytes())
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(n for _, n in self.live.values()))
        return out


@pytest.mark.parametrize(
    ("attention", "amp", "every"),
    [("explicit", False, None), ("sdpa", True, None), ("explicit", False, 1)],
)
def test_peak_matches_a_live_count_of_a_training_step(attention, amp, every):
    from torch.utils.checkpoint import checkpoint

    w = TinyGPTWorkload(layers=3, hidden=96, heads=3, seq_len=64, vocab=2000, attention=attention)
    strategies = {"amp": {}} if amp else {}
    if every:
        strategies["checkpoint"] = {"every": every}
    e = estimate(gpt_plan(attention, micro_batch=4, **strategies), w, CPU)
    torch.manual_seed(0)
    model = w.build_model()
    for i, block in enumerate(model.blocks):
        if every and i % every == 0:
            block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(
                block.forward
            )
    opt = torch.optim.AdamW(model.parameters())
    batch = w.batch(4, 0, "cpu")
    for _ in range(2):  # the second step has optimizer state, like every later one
        kept = [*model.parameters(), *(t for st in opt.state.values() for t in st.values())]
        with LiveBytes({t.untyped_storage().data_ptr() for t in kept}) as live:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = w.loss(model, batch)
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad()
    persistent = sum(e.memory[k] for k in ("parameters", "optimizer_state", "buffers"))
    predicted = e.peak_memory_bytes - persistent
    assert predicted == pytest.approx(live.peak, rel=0.08)
    assert e.upper_bound_bytes >= e.peak_memory_bytes


# --- step time, records, settings ---------------------------------------------------------


def test_step_time_scales_with_the_global_batch():
    w = TinyGPTWorkload()
    one = estimate(gpt_plan(micro_batch=4), w, CUDA, peak_flops=1e12)
    plan = gpt_plan(micro_batch=4, accumulation={})
    plan.global_batch_size = 16
    four = estimate(plan, w, CUDA, peak_flops=1e12)
    assert four.step_time_s == pytest.approx(4 * one.step_time_s)
    assert four.flops_per_step == pytest.approx(4 * one.flops_per_step)
    assert one.step_time_s == pytest.approx(w.flops_per_sample() * 4 / (1e12 * 0.4))
    # Activations are per micro-batch: accumulation leaves them alone.
    assert four.memory["activations"] == one.memory["activations"]
    cpu = estimate(gpt_plan(micro_batch=4), w, CPU, peak_flops=1e12)
    assert cpu.step_time_s == pytest.approx(one.step_time_s * 0.4 / 0.5)


def test_step_time_divides_over_the_data_parallel_ranks():
    w = TinyGPTWorkload()
    one = estimate(gpt_plan(micro_batch=4), w, CUDA, peak_flops=1e12)
    plan = gpt_plan(micro_batch=4)
    plan.layout = Layout(data=2)  # global batch 8 over 2 ranks
    two = estimate(plan, w, CUDA, peak_flops=1e12)
    assert two.flops_per_step == pytest.approx(2 * one.flops_per_step)
    assert two.step_time_s == pytest.approx(one.step_time_s)
    assert any("only the FLOPs are divided" in a for a in two.assumptions)


def test_without_a_peak_there_is_no_step_time():
    e = estimate(gpt_plan(), TinyGPTWorkload(), CPU)
    assert e.step_time_s is None
    assert e.flops_per_step > 0


def test_record_and_peak():
    e = estimate(gpt_plan(amp={}, checkpoint={"every": 2}), TinyGPTWorkload(), CUDA, 1e12)
    record = e.to_record()
    assert {"peak_memory_bytes", "step_time_s", "memory", "flops_per_step", "assumptions"} <= set(
        record
    )
    assert set(record["memory"]) == set(COMPONENTS)
    persistent = sum(e.memory[k] for k in ("parameters", "optimizer_state", "buffers"))
    assert e.peak_memory_bytes == persistent + max(e.phases.values())
    assert e.upper_bound_bytes == sum(e.memory.values()) >= e.peak_memory_bytes
    assert all(isinstance(a, str) and a for a in e.assumptions)
    assert "peak memory" in e.summary()


def test_optimizer_implementation_sets_the_step_temporaries():
    w = TinyGPTWorkload()
    psi = expected_parameters(w)
    temporaries = {
        name: estimate(gpt_plan(**strategies), w, CUDA).memory["optimizer_temporaries"]
        for name, strategies in {
            "default": {},  # torch's AdamW picks foreach on CUDA
            "fused": {"fused": {}},  # the fused strategy's default optimizer
            "triton": {"fused": {"optimizer": "triton"}},
            "lamb foreach": {"lamb": {}, "fused": {"optimizer": "foreach"}},
            "lamb clipped": {"lamb": {"max_grad_norm": 1.0}, "fused": {"optimizer": "foreach"}},
        }.items()
    }
    assert temporaries == {
        "default": 4 * psi, "fused": 0, "triton": 0,
        "lamb foreach": 8 * psi, "lamb clipped": 12 * psi,
    }


def test_distributed_strategies_are_said_to_be_unmodelled():
    plan = gpt_plan(zero={"stage": 2})
    plan.layout = Layout(data=2)
    e = estimate(plan, TinyGPTWorkload(), CUDA)
    assert any(a.startswith("Not modelled: zero") for a in e.assumptions)


@pytest.mark.parametrize(
    "strategies",
    [
        {"amp": {"dtype": "fp8"}},
        {"checkpoint": {"every": 0}},
        {"fused": {"attention": "flash"}},
        {"checkpoint": {"evry": 2}},
        {"no_such_strategy": {}},
    ],
)
def test_bad_settings_are_harness_errors(strategies):
    with pytest.raises(HarnessError):
        estimate(gpt_plan(**strategies), TinyGPTWorkload(), CPU)


def test_summary_reads_well():
    text = estimate(gpt_plan(amp={}), TinyGPTWorkload(), CPU, peak_flops=1e11).summary()
    assert "peak memory" in text and "step time" in text and "KiB" in text
