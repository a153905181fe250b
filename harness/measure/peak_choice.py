"""Which peak MFU divides by: the datasheet's, or the one measured on this device.

MFU uses the datasheet figure where the device is known (it is the convention
papers report against) and the measured one otherwise (CPUs vary too much for a
table, and so do GPUs missing from it). A measured rate above the datasheet by
more than 10 % means the table row does not describe this device (a variant
with other clocks); then the measured figure is used and the reason recorded.

The two figures come from `harness.measure.peaks` (the datasheet) and
`harness.measure.peak_calibration` (the calibration matmul); this module imports
both, and neither imports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from harness.measure.peak_calibration import measured_peak
from harness.measure.peaks import Peak, datasheet_peak, matmul_dtype, tf32_settings


@dataclass(frozen=True)
class PeakChoice:
    """Both peaks of a device, and the one MFU divides by."""

    dtype: str  # the dtype the matmuls run in ("tf32" for fp32 with TF32 on)
    datasheet: Peak | None
    measured: Peak
    used: Peak
    reason: str  # why `used` was chosen, in words

    def as_record(self) -> dict[str, Any]:
        """A JSON-ready record: both peaks, which one MFU uses, and why."""
        return {
            "dtype": self.dtype,
            "datasheet": asdict(self.datasheet) if self.datasheet else None,
            "measured": asdict(self.measured),
            "used": "datasheet" if self.used is self.datasheet else "measured",
            "flops": self.used.flops,
            "source": self.used.source,
            "reason": self.reason,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> PeakChoice:
        """The PeakChoice that `as_record` wrote (a rank reads it from prepared.json)."""
        datasheet = Peak(**record["datasheet"]) if record.get("datasheet") else None
        measured = Peak(**record["measured"])
        used = datasheet if record["used"] == "datasheet" and datasheet else measured
        return cls(record["dtype"], datasheet, measured, used, record["reason"])


def peaks_for(
    device: torch.device,
    device_name: str,
    dtype: str,
    *,
    cache: bool = True,
    convolutions: bool = False,
) -> PeakChoice:
    """Datasheet and measured peaks for `dtype` (the plan's compute dtype) on `device`;
    `convolutions`: the model has some, so cuDNN's TF32 setting counts for fp32 too."""
    eff = matmul_dtype(device, dtype, convolutions)
    sheet = datasheet_peak(device_name, eff) if device.type == "cuda" else None
    measured = measured_peak(device, eff, cache=cache)
    why = ""
    if eff == "tf32" and dtype == "fp32":
        why = f"fp32 runs on TF32 tensor cores ({tf32_settings(convolutions)}); "
    if sheet is None:
        reason = f"{why}no datasheet figure for {device_name} {eff}: MFU uses the measured peak"
        return PeakChoice(eff, None, measured, measured, reason)
    if measured.flops > 1.1 * sheet.flops:
        reason = (
            f"{why}measured {measured.flops / 1e12:.1f} TFLOP/s is above the datasheet's "
            f"{sheet.flops / 1e12:.1f}: the table row does not fit this device, "
            "MFU uses the measured peak"
        )
        return PeakChoice(eff, sheet, measured, measured, reason)
    return PeakChoice(eff, sheet, measured, sheet, f"{why}MFU uses the datasheet peak")
