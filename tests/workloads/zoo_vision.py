"""The vision zoo: torchvision and timm models, each built, traced by the estimator and
trained one step on the CPU, with activation checkpointing where the block finder finds
blocks. Writes the table of docs/benchmarks/zoo_vision_cpu_2026-11-24.md:

    python tests/workloads/zoo_vision.py --doc docs/benchmarks/zoo_vision_cpu_2026-11-24.md

(without --doc it prints the table; with model names and --doc, only their rows are
made anew). tests/test_zoo_vision.py holds that table: a fixed
sample (FAST) on every run, the whole list marked slow.

A model is `ok` when `training_harness.measure.prepare` accepts its plan (the workload built, the
plan checked, its FLOPs counted and the estimator's trace of its step) and one optimizer
step through `strategies.compose` gives a finite loss; `refused` when the harness says
why in one line (a HarnessError, as `harness bench` would exit 2 with); `failed`
otherwise (any other exception: a bug, shown as its type and first line).
"""

from __future__ import annotations

import gc
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DOC = ROOT / "docs" / "benchmarks" / "zoo_vision_cpu_2026-11-24.md"
SMALL = dict(num_classes=10, image_size=64)  # small images: seconds a model on a CPU
MICRO = 2

# (workload name, its arguments): a representative list of what vision users train.
MODELS: dict[str, dict[str, Any]] = {
    # torchvision
    "torchvision:resnet18": SMALL,
    "torchvision:resnet50": SMALL,
    "torchvision:resnext50_32x4d": SMALL,
    "torchvision:wide_resnet50_2": SMALL,
    "torchvision:mobilenet_v2": SMALL,
    "torchvision:mobilenet_v3_small": SMALL,
    "torchvision:mobilenet_v3_large": SMALL,
    "torchvision:efficientnet_b0": SMALL,
    "torchvision:efficientnet_v2_s": SMALL,
    "torchvision:convnext_tiny": SMALL,
    "torchvision:regnet_x_400mf": SMALL,
    "torchvision:regnet_y_400mf": SMALL,
    "torchvision:densenet121": SMALL,
    "torchvision:shufflenet_v2_x0_5": SMALL,
    "torchvision:squeezenet1_1": SMALL,
    "torchvision:mnasnet0_5": SMALL,
    "torchvision:googlenet": {**SMALL, "aux_logits": False, "init_weights": False},
    "torchvision:inception_v3": {**SMALL, "image_size": 96, "aux_logits": False,
                                 "init_weights": False},
    "torchvision:alexnet": SMALL,
    "torchvision:vgg11": SMALL,
    "torchvision:vit_b_16": {**SMALL, "image_size": 32},
    "torchvision:swin_t": SMALL,
    "torchvision:swin_v2_t": SMALL,
    "torchvision:maxvit_t": {**SMALL, "image_size": 224},  # windows of 7 at every stage
    # not classifiers: refused by name
    "torchvision:fasterrcnn_mobilenet_v3_large_fpn": SMALL,
    "torchvision:deeplabv3_mobilenet_v3_large": SMALL,
    # timm
    "timm:hf-hub:timm/resnet18.a1_in1k": SMALL,  # a hub name: nothing is downloaded
    "timm:resnet18": SMALL,
    "timm:resnet50": SMALL,
    "timm:resnet26t": SMALL,
    "timm:vit_tiny_patch16_224": SMALL,
    "timm:deit_tiny_patch16_224": SMALL,
    "timm:eva02_tiny_patch14_224": {**SMALL, "image_size": 56},
    "timm:cait_xxs24_224": SMALL,
    "timm:xcit_nano_12_p16_224": SMALL,
    "timm:mixer_s16_224": SMALL,
    "timm:convnext_atto": SMALL,
    "timm:efficientnet_b0": SMALL,
    "timm:tinynet_e": SMALL,
    "timm:mobilenetv3_small_050": SMALL,
    "timm:mobilenetv4_conv_small": SMALL,
    "timm:lcnet_050": SMALL,
    "timm:ghostnet_100": SMALL,
    "timm:rexnet_100": SMALL,
    "timm:regnetx_002": SMALL,
    "timm:densenet121": SMALL,
    "timm:dla34": SMALL,
    "timm:repvgg_a0": SMALL,
    "timm:hgnetv2_b0": SMALL,
    "timm:inception_v3": {**SMALL, "image_size": 96},
    "timm:vgg11": SMALL,
    "timm:swin_tiny_patch4_window7_224": SMALL,
    "timm:levit_128s": SMALL,
    "timm:efficientvit_b0": SMALL,
    "timm:fastvit_t8": SMALL,
    "timm:edgenext_xx_small": SMALL,
    "timm:mobilevit_xxs": SMALL,
    "timm:tiny_vit_5m_224": SMALL,
    "timm:poolformer_s12": SMALL,
    "timm:coatnet_nano_rw_224": SMALL,
    "timm:maxvit_nano_rw_256": SMALL,
}

# What every CI run tries (tests/test_zoo_vision.py): small and quick, both libraries,
# convolutions and attention, blocks found by both finders.
FAST = ["torchvision:mobilenet_v3_small", "torchvision:regnet_x_400mf",
        "timm:resnet18", "timm:vit_tiny_patch16_224", "timm:convnext_atto",
        "timm:mobilenetv3_small_050"]


@dataclass
class Outcome:
    model: str
    result: str  # "ok", "refused" or "failed"
    blocks: str  # what checkpointing wrapped, or why not
    detail: str  # ok: the loss and the parameters; else the reason, one line
    seconds: float

    def row(self) -> str:
        cells = [f"`{self.model}`", self.result, self.blocks, self.detail]
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def try_model(name: str, args: dict[str, Any] | None = None) -> Outcome:
    """Build, trace and train `name` one step (module docstring); never raises."""
    import torch

    from training_harness.core.errors import HarnessError
    from training_harness.core.plan import Plan
    from training_harness.measure.batches import split_batch
    from training_harness.measure.prepare import prepare
    from training_harness.strategies.compose import compose
    from training_harness.workloads import load_workload
    from training_harness.workloads.blocks import find_blocks

    args = dict(MODELS.get(name, SMALL) if args is None else args)
    start = time.perf_counter()
    # One thread: the sweep checks that a model trains, not how fast; on a shared CPU
    # two threads of many small ops waited on each other (60 s for FAST, 13 s on one).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    blocks = "-"

    def done(result: str, detail: str) -> Outcome:
        return Outcome(name, result, blocks, detail, time.perf_counter() - start)

    try:
        workload = load_workload(name, args)
        with torch.device("meta"):
            found = find_blocks(workload.build_model())
        strategies = {"checkpoint": {}} if found is not None else {}
        blocks = found.describe() if found is not None else "none found: not checkpointed"
        plan = Plan(workload=name, workload_args=args, device="cpu", micro_batch_size=MICRO,
                    global_batch_size=MICRO, strategies=strategies)
        prepared = prepare(plan)  # checks, FLOPs, the estimator's trace
        torch.manual_seed(0)
        model = prepared.workload.build_model()
        setup = compose(model, plan, "cpu")
        batch = split_batch(prepared.workload.batch(MICRO, 0, "cpu"), 1)
        loss = float(setup.step(batch, prepared.workload.loss))
        params = sum(p.numel() for p in model.parameters())
        if not math.isfinite(loss):
            return done("failed", f"the loss is {loss}")
        return done("ok", f"loss {loss:.3f}, {params / 1e6:.2f}M parameters")
    except HarnessError as e:
        return done("refused", str(e))
    except Exception as e:  # a bug: the sweep goes on, the table says which
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return done("failed", f"{type(e).__name__}: {first}")
    finally:
        torch.set_num_threads(threads)
        gc.collect()


def table(outcomes: list[Outcome]) -> str:
    lines = ["| model | result | checkpointed blocks | loss after one step, or the reason |",
             "| --- | --- | --- | --- |"]
    return "\n".join(lines + [o.row() for o in outcomes])


ROW = re.compile(r"^\| `([^`]+)` \| (ok|refused|failed) \| (.*) \|$")


def read_table(path: Path = DOC) -> dict[str, tuple[str, str]]:
    """The committed table: model -> (result, the rest of the row)."""
    rows = {}
    for line in path.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def _cells(rest: str) -> list[str]:
    """A committed row's blocks and detail cells, unescaped."""
    return [c.replace("\\|", "|") for c in rest.split(" | ", 1)]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import warnings

    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", type=Path, help="rewrite this doc's table in place")
    parser.add_argument("models", nargs="*", help="only these (default: all of MODELS)")
    opts = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    outcomes = []
    for name in opts.models or list(MODELS):
        o = try_model(name)
        print(f"{o.result:8} {o.seconds:6.1f}s  {name}: {o.detail}", file=sys.stderr)
        outcomes.append(o)
    counts = {r: sum(o.result == r for o in outcomes) for r in ("ok", "refused", "failed")}
    if opts.doc and opts.models:  # these rows anew, the others as they were
        ran = {o.model: o for o in outcomes}
        kept = read_table(opts.doc)
        outcomes = [ran.get(m) or Outcome(m, kept[m][0], *_cells(kept[m][1]), 0.0)
                    for m in MODELS if m in ran or m in kept]
        counts = {r: sum(o.result == r for o in outcomes) for r in ("ok", "refused", "failed")}
    summary = (f"{len(outcomes)} models: {counts['ok']} ok, {counts['refused']} refused, "
               f"{counts['failed']} failed (torch {torch.__version__})")
    text = table(outcomes)
    if opts.doc:
        doc = opts.doc.read_text()
        begin, end = "<!-- table -->", "<!-- /table -->"
        head, _, rest = doc.partition(begin)
        _, _, tail = rest.partition(end)
        opts.doc.write_text(f"{head}{begin}\n{summary}\n\n{text}\n{end}{tail}")
    else:
        print(summary + "\n\n" + text)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
