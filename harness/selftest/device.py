"""The CUDA devices here, learnt without CUDA in this process.

NVML (the `pynvml` module of nvidia-ml-py) gives the count, the name and the driver;
a short-lived `python -c "import torch; ..."` says whether torch can use them and
which torch, CUDA and Triton this environment runs. CUDA itself is initialised only
in that child, never here.

NVML numbers every device of the machine and ignores CUDA_VISIBLE_DEVICES, so the
variable is applied here as CUDA applies it: an empty value hides every device, and
the list stops at the first entry that names no device.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

PROBE = """
import json, importlib.metadata as md
import torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda,
        "available": bool(torch.cuda.is_available())}
try:
    info["triton"] = md.version("triton")
except Exception:
    info["triton"] = None
if info["available"]:
    info["count"] = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    info["name"], info["memory_bytes"] = props.name, props.total_memory
print(json.dumps(info))
"""


@dataclass
class Device:
    count: int  # CUDA devices visible to this process's children
    name: str | None
    driver: str | None = None
    memory_bytes: int | None = None
    torch: str | None = None
    cuda: str | None = None
    triton: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def slug(name: str | None) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3": a device's name for a file name."""
    text = re.sub(r"^nvidia\s+", "", (name or "gpu").strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "gpu"


def visible_entries(value: str | None, total: int) -> list[int | str]:
    """The NVML devices CUDA_VISIBLE_DEVICES=`value` leaves visible, as indexes or UUIDs."""
    if value is None:
        return list(range(total))
    seen: list[int | str] = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            break
        if re.fullmatch(r"-?\d+", entry):
            index = int(entry)
            if not 0 <= index < total or index in seen:
                break
            seen.append(index)
        else:
            seen.append(entry)  # GPU-<uuid> or MIG-<uuid>: NVML resolves it below
    return seen


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def nvml_facts() -> dict[str, Any] | str:
    """{"count", "name", "driver", "memory_bytes"} from NVML, or why NVML said nothing."""
    try:
        import pynvml
    except ImportError:
        return "no pynvml module (package nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver, no library
        return f"NVML: {type(e).__name__}: {e}"
    try:
        total = pynvml.nvmlDeviceGetCount()
        handles = []
        for entry in visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"), total):
            try:
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(entry)
                               if isinstance(entry, int)
                               else pynvml.nvmlDeviceGetHandleByUUID(entry))
            except Exception:
                break  # as CUDA: the list ends at an entry that names no device
        facts: dict[str, Any] = {"count": len(handles), "total": total, "name": None,
                                 "memory_bytes": None,
                                 "driver": _text(pynvml.nvmlSystemGetDriverVersion())}
        if handles:
            facts["name"] = _text(pynvml.nvmlDeviceGetName(handles[0]))
            facts["memory_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(handles[0]).total)
        return facts
    except Exception as e:
        return f"NVML: {type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def torch_facts(timeout_s: float = 180.0) -> dict[str, Any] | str:
    """What torch sees, asked in a child process; or why it could not say."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"`import torch` did not answer within {timeout_s:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"torch could not be asked ({tail})"
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        return f"torch answered {lines[-1][:80]!r}"


def find_cuda(timeout_s: float = 180.0) -> tuple[Device | None, str]:
    """(the devices, "") where torch can use a CUDA device; else (None, why not)."""
    nvml = nvml_facts()
    if isinstance(nvml, dict) and nvml["count"] == 0:
        hidden = f" (CUDA_VISIBLE_DEVICES hides its {nvml['total']})" if nvml["total"] else ""
        return None, f"NVML sees no device{hidden}"
    seen = torch_facts(timeout_s)
    if isinstance(seen, str):
        return None, seen if isinstance(nvml, dict) else f"{nvml}; {seen}"
    if not seen.get("available"):
        built = f"torch {seen.get('torch')}, CUDA {seen.get('cuda') or 'none'}"
        return None, (f"{built}: torch.cuda.is_available() is False"
                      + (f" though NVML sees {nvml['count']} device(s)"
                         if isinstance(nvml, dict) else ""))
    facts = nvml if isinstance(nvml, dict) else {}
    device = Device(count=int(seen.get("count") or facts.get("count") or 0),
                    name=seen.get("name") or facts.get("name"), driver=facts.get("driver"),
                    memory_bytes=seen.get("memory_bytes") or facts.get("memory_bytes"),
                    torch=seen.get("torch"), cuda=seen.get("cuda"), triton=seen.get("triton"))
    return device, ""
