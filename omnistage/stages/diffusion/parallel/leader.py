"""Rank 0 of a multi-device replica, inside its diffusion engine: each step is planned on the event
loop (where aborts happen, so the plan is a consistent snapshot), sent to the other ranks, run here
on this rank's copies like everywhere else, and its outcome copied back to the engine's requests."""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle

import zmq

from omnistage.pipeline import StageContext
from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.parallel.group import RankGroup, join, leave, rank_device
from omnistage.stages.diffusion.parallel.layout import group_of
from omnistage.stages.diffusion.parallel.steps import NewJob, RankSteps, StepPlan, encode, parallelize
from omnistage.stages.diffusion.runner import StepResult

logger = logging.getLogger(__name__)


class Leader:
    def __init__(self, steps: RankSteps, sockets: list[zmq.Socket], zctx: zmq.Context):
        self.steps = steps
        self._sockets = sockets
        self._zctx = zctx
        self._handles = itertools.count()
        self._fronts: dict[int, DiffusionJob] = {}  # handle -> the engine's request

    @classmethod
    def start(cls, ctx: StageContext, adapter: DiffusionAdapter) -> Leader:
        """Join the group as rank 0 (blocks until every rank has loaded its model and joined)."""
        info = group_of(ctx)
        if info is None:
            raise ValueError(
                f"stages[{ctx.spec.stage_id}].parallel_config: a replica over "
                f"{ctx.deploy.devices_per_replica} devices runs as a process group "
                "(omnistage.engine.stage_factory.build_engine starts one), not as a lone engine"
            )
        zctx = zmq.Context()
        sockets = []
        for addr in info.plan_addrs:
            sock = zctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(addr)
            sockets.append(sock)
        try:
            group = join(info, 0, rank_device(ctx.devices, 0))
            parallelize(adapter, group, ctx)
        except BaseException:
            for sock in sockets:
                sock.close()
            zctx.term()
            raise
        logger.info("stage %d replica %d: rank 0 of %s", ctx.spec.stage_id, ctx.replica, info.layout.describe())
        return cls(RankSteps(adapter, group), sockets, zctx)

    @property
    def group(self) -> RankGroup:
        return self.steps.group

    def plan(self, batch: list[DiffusionJob], new: list[DiffusionJob]) -> StepPlan:
        """The step as the ranks will run it (call on the event loop: ``closed`` flags do not move under it).
        Requests closed since the last plan (finished, failed, aborted) are dropped from the ranks' copies."""
        drop = [h for h, j in self._fronts.items() if j.closed]
        for h in drop:
            del self._fronts[h]
        plan = StepPlan(drop=drop)
        known = {id(j): h for h, j in self._fronts.items()}
        for j in new:
            if j.closed:
                continue
            h = next(self._handles)
            self._fronts[h] = j
            known[id(j)] = h
            plan.new.append(NewJob(h, pickle.dumps(j)))
        plan.batch = [known[id(j)] for j in batch if not j.closed and id(j) in known]
        return plan

    async def step(self, batch: list[DiffusionJob], new: list[DiffusionJob]) -> StepResult:
        plan = self.plan(batch, new)
        return await asyncio.to_thread(self._run, plan)

    def _run(self, plan: StepPlan) -> StepResult:
        data = encode(plan)
        for sock in self._sockets:
            sock.send(data)
        done = self.steps.execute(plan)
        # the outcome, on the engine's requests
        front = {id(j): self._fronts[self.steps.handle(j)] for j in self.steps.jobs.values()}
        result = StepResult()
        for copy in done.advanced:
            j = front[id(copy)]
            # the key too: a phased family (Helios' pyramid) re-keys a job between its phases
            j.step, j.sampler_state, j.key = copy.step, copy.sampler_state, copy.key
            result.advanced.append(j)
        result.finished = [(front[id(c)], data) for c, data in done.finished]
        result.failed = [(front[id(c)], err) for c, err in done.failed]
        return result

    def close(self) -> None:
        """Tell the other ranks to leave (without waiting on ranks that may be gone) and leave the group."""
        data = encode(StepPlan(stop=True))
        for sock in self._sockets:
            try:
                sock.send(data, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            sock.close()
        self._zctx.term()
        leave()
