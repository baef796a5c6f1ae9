"""Which device does what in a multi-device diffusion replica, and what its processes are told at launch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omnistage.pipeline import StageContext, StageSpec

if TYPE_CHECKING:
    from omnistage.config.schema import DeployConfig, StageDeployConfig
    from omnistage.pipeline import Pipeline


@dataclass(frozen=True)
class Layout:
    """``cfg`` groups of ``ulysses`` ranks each: rank = cfg index * ulysses + ulysses index."""

    cfg: int
    ulysses: int

    @property
    def world(self) -> int:
        return self.cfg * self.ulysses

    def coords(self, rank: int) -> tuple[int, int]:
        """(cfg index, ulysses index) of a rank."""
        return divmod(rank, self.ulysses)

    def describe(self) -> str:
        return f"{self.world} ranks, cfg_parallel_size={self.cfg} x ulysses_degree={self.ulysses}"

    @classmethod
    def of(cls, ctx: StageContext) -> Layout:
        return cls.of_deploy(ctx.deploy)

    @classmethod
    def of_deploy(cls, deploy: StageDeployConfig) -> Layout:
        pc = deploy.parallel_config
        if pc is None:
            return cls(1, deploy.devices_per_replica)
        return cls(*pc.diffusion_degrees())


def runs_as_group(spec: StageSpec, deploy: StageDeployConfig) -> bool:
    """Whether a replica of this stage is a process group (engine/stage_factory.py builds one)."""
    return spec.kind == "diffusion" and spec.engine is None and deploy.devices_per_replica > 1


def replica_lines(pipeline: Pipeline, deploy: DeployConfig) -> list[str]:
    """One line per multi-device diffusion replica: its ranks, degrees, devices and backend, as its
    launch will choose them (``omnistage serve`` logs them at start-up; nothing is started here)."""
    from omnistage.config.schema import StageDeployConfig
    from omnistage.stages.diffusion.devices import backend_for, rank_device

    lines = []
    for spec in pipeline.stages:
        sd = deploy.stage(spec.stage_id) or StageDeployConfig(stage_id=spec.stage_id)
        if not runs_as_group(spec, sd):
            continue
        layout = Layout.of_deploy(sd)
        for replica, devices in enumerate(sd.replica_devices()):
            ranks = [rank_device(devices, r) for r in range(layout.world)]
            lines.append(
                f"stage {spec.stage_id} replica {replica}: {layout.describe()}, devices "
                f"{','.join(str(d) for d in ranks)}, backend {backend_for(ranks[0])}"
            )
    return lines


@dataclass(frozen=True)
class GroupInfo:
    """Where a launch's ranks meet: the rendezvous of ``torch.distributed`` (a file store: the ranks are
    processes of one machine, and no port can be taken by someone else meanwhile) and rank 0's step-plan
    sockets (one ZeroMQ ipc address per other rank). Fresh for every launch (a restart gets new ones)."""

    layout: Layout
    init_method: str  # file://...
    plan_addrs: tuple[str, ...]  # plan_addrs[r - 1]: rank r's


@dataclass
class GroupStageContext(StageContext):
    """A StageContext that also says which process group its replica is (every rank gets the same one)."""

    group: GroupInfo | None = None


def group_of(ctx: StageContext) -> GroupInfo | None:
    return ctx.group if isinstance(ctx, GroupStageContext) else None
