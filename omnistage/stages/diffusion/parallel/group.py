"""A rank joining its replica's ``torch.distributed`` process group, and the sub-groups the steps use."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from omnistage.stages.diffusion.devices import backend_for, rank_device  # noqa: F401 - re-exported
from omnistage.stages.diffusion.parallel.layout import GroupInfo, Layout

# How long a rank waits in a collective (and for the others at the rendezvous, while they load the model).
# A dead rank is found by the launcher watching the processes, long before this.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)


@dataclass
class RankGroup:
    rank: int
    layout: Layout
    device: torch.device
    control: Any  # a gloo group over every rank, for small Python objects
    cfg_group: Any  # the ranks that share this rank's ulysses index (CFG parallel's all-gather); None if cfg == 1
    ulysses_mesh: Any  # DeviceMesh ("ring", "ulysses") of this rank's cfg index; None if ulysses == 1

    @property
    def cfg_index(self) -> int:
        return self.layout.coords(self.rank)[0]


def join(info: GroupInfo, rank: int, device: torch.device) -> RankGroup:
    """Join the launch's process group (blocks until every rank has) and build the layout's sub-groups.
    Every rank makes the same calls in the same order: group creation is collective."""
    from torch.distributed.device_mesh import init_device_mesh

    layout = info.layout
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend_for(device),
        init_method=info.init_method,
        rank=rank,
        world_size=layout.world,
        timeout=COLLECTIVE_TIMEOUT,
    )
    control = dist.new_group(backend="gloo")
    mesh = init_device_mesh(device.type, (layout.cfg, 1, layout.ulysses), mesh_dim_names=("cfg", "ring", "ulysses"))
    return RankGroup(
        rank=rank,
        layout=layout,
        device=device,
        control=control,
        cfg_group=mesh["cfg"].get_group() if layout.cfg > 1 else None,
        ulysses_mesh=mesh["ring", "ulysses"] if layout.ulysses > 1 else None,
    )


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
