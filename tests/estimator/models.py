"""The estimator tests' workloads: a small GPT with the harness's attention cores, a
classifier on the same blocks, an MLP; and plans for them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.core.device import RuntimeEnv
from training_harness.core.plan import Plan
from training_harness.workloads.attention import ATTENTION
from training_harness.workloads.base import TransformerShape, Workload

CPU = RuntimeEnv("cpu", "test cpu", 1, bf16=True, triton=False)
CUDA = RuntimeEnv("cuda", "test gpu", 1, bf16=True, triton=False)
# A block's shape for the formula tests: large enough for the s² terms to matter.
SHAPE = TransformerShape(layers=4, hidden=256, heads=8, seq_len=512, vocab=1000, ffn_hidden=1024)


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
