"""The moments of backward on traced models, against a live count of a CPU training
step: the loss's working set (log-softmax's two gradients), a checkpointed block's
rebuild once the loss is freed, and an early block's backward meeting the later
blocks' gradients (a ResNet's peak)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.estimator.measure import LiveBytes
from tests.estimator.models import CPU
from training_harness.core.plan import Plan
from training_harness.estimator import estimate
from training_harness.workloads.base import Workload


class Residual(nn.Module):
    def __init__(self, width: int, pool: bool) -> None:
        super().__init__()
        self.fc, self.pool = nn.Linear(width, width), pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + F.gelu(self.fc(x))
        return x[:, ::2] if self.pool else x  # halve the tokens, as a ResNet's stages do


class TinyLM(Workload):
    """Tokens through residual blocks to a per-token vocabulary head (no `shape`:
    traced), or with `pool`, to a class of the mean token, the tokens halved per block."""

    name = "tiny-lm"

    def __init__(self, pool: bool = False, width: int = 64, vocab: int = 1024) -> None:
        self.pool, self.width, self.vocab = pool, width, vocab

    def build_model(self) -> nn.Module:
        model = nn.Module()
        model.embed = nn.Embedding(self.vocab, self.width)
        model.blocks = nn.ModuleList(Residual(self.width, self.pool) for _ in range(4))
        model.head = nn.Linear(self.width, 10 if self.pool else self.vocab)
        return model

    def batch(self, batch_size: int, index: int, device: torch.device | str) -> tuple:
        g = torch.Generator().manual_seed(index)
        ids = torch.randint(self.vocab, (batch_size, 64), generator=g)
        return ids.to(device), ids.roll(-1, 1).to(device) % (10 if self.pool else self.vocab)

    def loss(self, model: nn.Module, batch: tuple) -> torch.Tensor:
        ids, targets = batch
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x)
        if self.pool:
            return F.cross_entropy(model.head(x.mean(1)), targets[:, 0])
        return F.cross_entropy(model.head(x).flatten(0, 1), targets.flatten())


def live_peak(w: TinyLM, batch_size: int, checkpointed: bool) -> int:
    """Peak live bytes of the second of two AdamW steps, persistent state left out."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = w.build_model()
    if checkpointed:
        for block in model.blocks:
            block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(
                block.forward
            )
    opt = torch.optim.AdamW(model.parameters())
    batch = w.batch(batch_size, 0, "cpu")
    for _ in range(2):
        kept = [*model.parameters(), *(t for st in opt.state.values() for t in st.values())]
        with LiveBytes({t.untyped_storage().data_ptr() for t in kept}) as live:
            w.loss(model, batch).backward()
            opt.step()
            opt.zero_grad()
    return live.peak


@pytest.mark.parametrize(
    ("checkpointed", "moment"),
    [
        (False, "backward_start"),  # the loss: log-softmax's two gradients
        (True, "backward_start"),  # the rebuild no longer counts the loss's log-softmax
    ],
)
def test_the_loss_peak_matches_a_live_count(checkpointed, moment):
    w = TinyLM()
    plan = Plan(workload=w.name, micro_batch_size=4,
                strategies={"checkpoint": {}} if checkpointed else {})
    e = estimate(plan, w, CPU)
    assert max(e.phases, key=e.phases.get) == moment
    assert _above_state(e) == pytest.approx(live_peak(w, 4, checkpointed), rel=0.02)


def test_an_early_block_meets_the_later_blocks_gradients():
    # The first block keeps the most (the tokens are halved per block) and its backward
    # comes after every other block's gradients: the peak, which no other moment
    # reaches. Within a block the moment counts its tensors, its working set and its
    # gradients at once, though some are freed before others come: an upper bound.
    w = TinyLM(pool=True, width=512)
    e = estimate(Plan(workload=w.name, micro_batch_size=16), w, CPU)
    live = live_peak(w, 16, False)
    others = max(v for k, v in e.phases.items() if k != "backward_blocks")
    assert others < live <= _above_state(e)


def _above_state(e) -> int:
    return e.peak_memory_bytes - sum(
        e.memory[k] for k in ("parameters", "optimizer_state", "buffers")
    )
