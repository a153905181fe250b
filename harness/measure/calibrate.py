"""The calibration process: a device's peak matmul rate, measured and gone.

    python -m harness.measure.calibrate cuda:0 bf16 tf32
        ->  {"bf16": {"flops": ..., "source": ...}, "tf32": {...}}
    python -m harness.measure.calibrate --overhead cuda:0
        ->  {"context_bytes": ..., "workspace_bytes": ..., ...}  (device_overhead.py)

Started by `harness.measure.peak_calibration.measured_peak` on a cache miss. Besides
a trial's ranks it is the only process that touches a GPU: its CUDA context lives
for the few seconds of the matmuls and ends with it. (On a CPU it runs the same way,
so that no process that prepares trials ever runs the calibration itself.) The dtype comes
resolved ("tf32", not "fp32" with TF32 on): the caller's TF32 settings decide it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main(argv: list[str] | None = None) -> int:
    import torch

    from harness.measure.peak_calibration import _measure

    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--overhead":
        from harness.measure.device_overhead import measure

        print(json.dumps(asdict(measure(torch.device(args[1])))), flush=True)
        return 0
    device, *dtypes = args
    peaks = {d: asdict(_measure(torch.device(device), d)) for d in dtypes}
    print(json.dumps(peaks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
