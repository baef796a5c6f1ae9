"""Parent side of a multi-device diffusion replica: its ranks started, watched and restarted together.

Rank 0 is an ordinary ``mp`` stage process (transport/process.py: the diffusion engine behind ZeroMQ;
the engine sees from its context that it leads a group); ranks 1.. are processes of their own
(worker.py). The launcher watches all of them: when any rank exits, or rank 0 reports itself broken
(a failed step, engine.py), the replica's requests fail as unavailable (HTTP 503, naming the rank) and
every rank is stopped and started again, with remote.py's restart policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import tempfile
import uuid

from omnistage.pipeline import StageContext
from omnistage.stages.diffusion.parallel.layout import GroupInfo, GroupStageContext, Layout
from omnistage.stages.diffusion.parallel.ulysses import SUPPORTED, unsupported_in_folder
from omnistage.stages.diffusion.parallel.worker import run_rank
from omnistage.stages.lifetime import run_in_spawner
from omnistage.transport.process import WATCH_INTERVAL_S, ProcessStageEngine

logger = logging.getLogger(__name__)

JOIN_S = 5.0  # a rank's time to leave after rank 0 told it to, then after terminate


def check_supported(ctx: StageContext) -> None:
    """What a multi-device replica cannot do (yet), as start-up errors naming the deploy field."""
    d, where = ctx.deploy, f"stages[{ctx.spec.stage_id}]"
    if d.process_mode == "ray":
        raise ValueError(
            f"{where}.process: a diffusion replica over {d.devices_per_replica} devices runs as local "
            "processes (inline or mp), not as a Ray actor"
        )
    if d.lora_enabled:
        raise ValueError(
            f"{where}.enable_lora: per-request LoRA adapters are not available on a replica over "
            f"{d.devices_per_replica} devices"
        )
    bad = unsupported_in_folder(ctx.model) if Layout.of(ctx).ulysses > 1 else []
    if bad:
        raise ValueError(
            f"{where}.parallel_config.ulysses_degree: pipeline {ctx.pipeline_name!r} runs "
            f"{', '.join(bad)}, which has no sequence-parallel plan (models with one: "
            f"{', '.join(SUPPORTED)}; cfg_parallel_size splits rows instead)"
        )
    acc = d.acceleration
    if acc is not None:
        for key, on in (("cache", acc.cache is not None), ("compile", acc.compile), ("offload", acc.offload != "none")):
            if on:
                raise ValueError(
                    f"{where}.acceleration.{key}: not available on a replica over "
                    f"{d.devices_per_replica} devices (vae_tiling is)"
                )


class ProcessGroupStageEngine(ProcessStageEngine):
    what = "process group"

    def __init__(self, ctx: StageContext):
        check_supported(ctx)
        fields = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(StageContext)}
        super().__init__(GroupStageContext(**fields))
        self.layout = Layout.of(ctx)
        self._ranks: list[mp.process.BaseProcess] = []  # ranks 1.. (rank 0 is ProcessStageEngine's process)
        self._store: str | None = None

    @property
    def rank_pids(self) -> list[int | None]:
        """Process ids by rank (for inspection and tests)."""
        return [self.pid] + [p.pid for p in self._ranks]

    def payload(self) -> bytes:
        """The context every rank of the next launch gets: a fresh rendezvous and fresh plan sockets."""
        base = os.path.join(tempfile.gettempdir(), f"omnistage-group-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self._store = f"{base}-store"
        self.ctx.group = GroupInfo(
            self.layout, f"file://{self._store}", tuple(f"ipc://{base}-plan{r}" for r in range(1, self.layout.world))
        )
        return super().payload()

    async def _launch(self, payload: bytes) -> None:
        spawn = mp.get_context("spawn")
        name = f"omnistage-stage{self.stage_id}-r{self.ctx.replica}"
        self._ranks = [
            spawn.Process(target=run_rank, args=(payload, r, os.getpid()), name=f"{name}-rank{r}", daemon=True)
            for r in range(1, self.layout.world)
        ]
        for p in self._ranks:
            await run_in_spawner(p.start)  # each rank dies with this process (stages/lifetime.py)
        rank0 = asyncio.create_task(super()._launch(payload))  # returns once rank 0 has joined and is ready
        others = asyncio.create_task(self._rank_exit())
        done, _ = await asyncio.wait({rank0, others}, return_when=asyncio.FIRST_COMPLETED)
        if rank0 in done:
            others.cancel()
            rank0.result()  # a failed rank 0 raised its StartFailed message (and stopped every rank)
            logger.info(
                "stage %d replica %d: %s started, pids %s",
                self.stage_id,
                self.ctx.replica,
                self.layout.describe(),
                self.rank_pids,
            )
            return
        rank0.cancel()
        await asyncio.gather(rank0, return_exceptions=True)
        reason = others.result()
        await self._stop()
        raise RuntimeError(
            f"stage {self.stage_id}: {reason} while the replica started (its traceback is in the log above)"
        )

    def _exited(self, ranks: range) -> str | None:
        for r in ranks:
            p = self._proc if r == 0 else self._ranks[r - 1]
            if p is not None and not p.is_alive():
                return f"rank {r} of {self.layout.world} exited with code {p.exitcode}"
        return None

    async def _rank_exit(self) -> str:
        """Returns (the reason) when a rank other than 0 has exited (while starting: rank 0 is still busy)."""
        while (reason := self._exited(range(1, self.layout.world))) is None:
            await asyncio.sleep(WATCH_INTERVAL_S)
        return reason

    async def _until_dead(self) -> str:
        while True:
            reason = self._exited(range(self.layout.world))
            if reason is not None:
                return reason
            if not self._stats.healthy:  # rank 0's engine broke (a failed step): restart the group
                # a rank that died is the cause of the failed step: name it (it is reaped by now)
                return self._exited(range(self.layout.world)) or self._stats.detail or "rank 0 broke"
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def _stop(self) -> None:
        await super()._stop()  # rank 0 first: its engine tells the other ranks to leave
        for p in self._ranks:
            for stop in (None, p.terminate, p.kill):
                if stop is not None:
                    stop()
                await asyncio.to_thread(p.join, JOIN_S)
                if not p.is_alive():
                    break
        self._ranks = []
        if self._store is not None and os.path.exists(self._store):
            os.remove(self._store)
