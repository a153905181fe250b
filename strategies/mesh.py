"""The device mesh of a trial: ranks arranged (pipeline, data, tensor), tensor fastest.

Every parallel strategy takes its process group from one named dimension of
this mesh, so they compose: DDP and FSDP2 reduce over "data", tensor parallel
shards over "tensor", the pipeline sends between "pipeline" neighbours. The
order matches `training_harness.core.plan.Layout.coordinates`: global rank r sits at
mesh[layout.coordinates(r)].
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training_harness.core.errors import HarnessError
from training_harness.core.plan import Layout, Plan

DIMS = ("pipeline", "data", "tensor")

_cache: dict[tuple, DeviceMesh] = {}


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The (pipeline, data, tensor) mesh of this process group, built once per process.

    On the CPU pass "cpu": FSDP2 and DTensor need an explicit CPU mesh (gloo).
    """
    if not dist.is_initialized():
        raise HarnessError(
            "a parallel layout needs torch.distributed initialised; "
            "launch the plan with `harness bench` (torchrun), not in-process"
        )
    shape = (layout.pipeline, layout.data, layout.tensor)
    key = (id(dist.group.WORLD), *shape, device_type)
    if key not in _cache:
        if dist.get_world_size() != layout.world_size:
            raise HarnessError(
                f"layout pipeline {layout.pipeline} x data {layout.data} x tensor "
                f"{layout.tensor} = {layout.world_size} ranks, but {dist.get_world_size()} "
                "were launched; launch as many ranks as the layout has"
            )
        _cache[key] = init_device_mesh(device_type, shape, mesh_dim_names=DIMS)
    return _cache[key]


def submesh(mesh: DeviceMesh | None, dim: str, who: str) -> DeviceMesh:
    """The 1-D sub-mesh of `dim` ("pipeline", "data" or "tensor") this rank belongs to."""
    if mesh is None:
        raise HarnessError(
            f"{who} needs a device mesh: run it with world size > 1 under torchrun "
            "(`harness bench`), where compose builds one"
        )
    return mesh[dim]


def group(mesh: DeviceMesh | None, dim: str, who: str) -> dist.ProcessGroup:
    """The process group of `dim` this rank belongs to."""
    return submesh(mesh, dim, who).get_group()


def layout_reasons(plan: Plan) -> list[str]:
    """Each layout dimension above 1 needs a strategy that uses it, in words."""
    names = set(plan.strategies)
    layout = plan.layout
    reasons = []
    if layout.data > 1 and not names & {"ddp", "zero"}:
        reasons.append(
            f"layout data = {layout.data} but neither ddp nor zero splits the batch over "
            "those ranks; add [strategies.ddp] or [strategies.zero], or set data = 1"
        )
    if layout.pipeline > 1 and "pipeline" not in names:
        reasons.append(
            f"layout pipeline = {layout.pipeline} but no [strategies.pipeline] splits "
            "the model into stages; add it or set pipeline = 1"
        )
    if layout.tensor > 1 and "tensor" not in names:
        reasons.append(
            f"layout tensor = {layout.tensor} but no [strategies.tensor] shards the "
            "blocks; add it or set tensor = 1"
        )
    return reasons
