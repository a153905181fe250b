"""`harness calibrate`: measure this machine's device profile for the estimator.

The profile (training_harness.measure.device_profile) is kept in the machine's cache,
and `harness estimate`, `bench` and `tune` on this device cost a step with it from then
on. `--out` writes a copy, the form the repository keeps for GPUs
(harness/estimator/profiles/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from training_harness.core.errors import HarnessError


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure this device's profile for the estimator "
                                         "(matmuls by shape, bandwidth, per-operator cost)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--quick", action="store_true", help="a coarser grid (seconds, not a minute)")
    p.add_argument("--out", metavar="FILE", help="also write the profile there (JSON)")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from training_harness.measure.device_profile import calibrate

    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise HarnessError(f"--device {args.device!r} is not a device; use cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise HarnessError(f"--device {args.device}: only cpu and cuda are profiled")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HarnessError("--device cuda: this machine has no CUDA device; use --device cpu")
    print(f"measuring the profile of {device} (a process of its own)...", flush=True)
    profile = calibrate(device, quick=args.quick)
    print(summary(profile))
    if args.out:
        Path(args.out).write_text(json.dumps(profile, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def summary(profile: dict) -> str:
    """A few lines a person can check: the best matmul rate per dtype, the bandwidth of a
    large add, the host's cost per operator, AdamW's cost per tensor."""
    lines = [f"profile of {profile['device_name']} ({profile['threads']} threads, torch "
             f"{profile['torch']}), measured {profile['measured_at']}"]
    for dtype, rows in profile["matmul"].items():
        m, n, k, s = max(rows, key=lambda r: 2 * r[0] * r[1] * r[2] / r[3])
        lines.append(f"  matmul {dtype}: best {2 * m * n * k / s / 1e9:.1f} GFLOP/s "
                     f"({m}x{n}x{k}), {len(rows)} shapes")
    nbytes, s = profile["elementwise"]["fp32"]["binary"][-1]
    lines.append(f"  add of {nbytes / 2**20:.0f} MiB: {nbytes / s / 1e9:.1f} GB/s")
    lines.append(f"  host overhead per operator in a step: {profile['op_overhead_s'] * 1e6:.2f} us")
    for kind, (per_tensor, per_element) in profile["optimizer"].items():
        lines.append(f"  {kind}: {per_tensor * 1e6:.1f} us per tensor + "
                     f"{per_element * 1e9:.2f} ns per element")
    lines.append("kept in this machine's cache: harness estimate, bench and tune use it")
    return "\n".join(lines)
