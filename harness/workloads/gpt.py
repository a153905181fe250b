"""A GPT-style decoder language model (pre-norm, learned positions, tied weights)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from training_harness.core.config import bounded, from_table
from training_harness.core.errors import HarnessError
from training_harness.workloads.attention import ATTENTION
from training_harness.workloads.base import TransformerShape, Workload
from training_harness.workloads.data import check_name, is_synthetic
from training_harness.workloads.data import tokens as token_data
from training_harness.workloads.meta import on_meta
from training_harness.workloads.tokens import next_token


@dataclass
class GPTConfig:
    layers: int = bounded(4, 1, 4096)
    heads: int = bounded(4, 1, 4096)
    hidden: int = bounded(256, 1, 2**20)
    seq_len: int = bounded(256, 1, 2**24)
    vocab: int = bounded(8192, 1, 2**26)
    ffn_mult: int = bounded(4, 1, 256)
    dropout: float = bounded(0.0, 0.0, 0.99)
    attention: Literal["explicit", "sdpa"] = "explicit"
    tie_weights: bool = True
    data: str = "synthetic"  # or "text" (vocab 256) or a token file (workloads.data)

    def validate(self, where: str) -> None:
        check_name(self.data, "tokens", where)
        if self.hidden % self.heads:
            raise HarnessError(
                f"{where}: hidden {self.hidden} is not divisible by heads {self.heads}; "
                "choose hidden as a multiple of heads"
            )


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.up = nn.Linear(hidden, inner)
        self.act = nn.GELU(approximate="tanh")
        self.down = nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.hidden // cfg.heads
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.attention = ATTENTION[cfg.attention](dropout=cfg.dropout)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg.hidden, cfg.ffn_mult * cfg.hidden)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # Head counts follow from the shapes: under tensor parallel (strategies.tensor)
        # qkv yields this rank's [q; k; v] heads only, and proj takes their width.
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = self.attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        x = x + F.dropout(self.proj(y), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight
        # A module, so a fused kernel can replace it (kernels.cross_entropy), or fuse it
        # with the head: a criterion that `fuses_head` takes (hidden, weight, targets,
        # bias) instead of the logits (kernels.linear_cross_entropy).
        self.criterion = nn.CrossEntropyLoss()
        self.apply(self._init)
        for block in self.blocks:  # GPT-2: scale residual projections by 1/sqrt(2L)
            for proj in (block.proj, block.mlp.down):
                nn.init.normal_(proj.weight, std=0.02 / (2 * cfg.layers) ** 0.5)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = F.dropout(self.wte(idx) + self.wpe(pos), self.cfg.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None and getattr(self.criterion, "fuses_head", False):
            # fused linear_cross_entropy: the head's input and weight, no logits held
            return self.criterion(x.reshape(-1, x.size(-1)), self.lm_head.weight,
                                  targets.reshape(-1), self.lm_head.bias)
        logits = self.lm_head(x)
        if targets is None:
            return logits
        return self.criterion(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class GPTWorkload(Workload):
    name = "gpt"

    def __init__(self, cfg: GPTConfig):
        self.cfg = cfg
        self.data = cfg.data
        if not is_synthetic(cfg.data):
            token_data(cfg.data).check(cfg.seq_len, cfg.vocab, "[workload]")
        self.tokens_per_sample = cfg.seq_len
        self.shape = TransformerShape(
            layers=cfg.layers,
            hidden=cfg.hidden,
            heads=cfg.heads,
            seq_len=cfg.seq_len,
            vocab=cfg.vocab,
            ffn_hidden=cfg.ffn_mult * cfg.hidden,
            dropout=cfg.dropout,
        )

    def build_model(self) -> GPT:
        return GPT(self.cfg)

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        """Learnable synthetic text (workloads.tokens: x[t+1] = (5·x[t] + 17) mod V from a
        random start, 10% of tokens replaced by noise), so the loss falls as the model
        learns instead of sitting at log V. Real data: random windows."""
        cfg = self.cfg
        if not is_synthetic(cfg.data):
            return token_data(cfg.data).next_token(batch_size, index, cfg.seq_len, device)
        return next_token(batch_size, index, cfg.seq_len, cfg.vocab, device)

    def eval_batch(self, batch_size: int, index: int, device: torch.device | str) -> Any:
        if is_synthetic(self.cfg.data):
            return super().eval_batch(batch_size, index, device)
        return token_data(self.cfg.data).next_token(batch_size, index, self.cfg.seq_len, device,
                                                    held_out=True)

    def data_info(self) -> dict[str, Any]:
        if is_synthetic(self.cfg.data):
            return super().data_info()
        return token_data(self.cfg.data).describe()

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        idx, targets = batch
        return model(idx, targets)

    def flops_per_sample(self) -> float:
        """6N + 12·L·H·Q·T per token (PaLM, appendix B), times T tokens.

        N counts the parameters that take part in a matmul: every embedding lookup is
        counted out (positions, and the token embedding when untied). Tied, the token
        embedding's matrix is the LM head and counts once, as the head.
        """
        cfg = self.cfg
        with on_meta():
            model = self.build_model()
        lookups = [model.wpe.weight]
        if model.wte.weight is not model.lm_head.weight:
            lookups.append(model.wte.weight)
        n = sum(p.numel() for p in model.parameters()) - sum(w.numel() for w in lookups)
        per_token = 6 * n + 12 * cfg.layers * cfg.hidden * cfg.seq_len
        return float(per_token * cfg.seq_len)


def build_gpt(**args: Any) -> GPTWorkload:
    return GPTWorkload(from_table(GPTConfig, args, "[workload]"))
