"""The step every rank of a multi-device replica runs, from rank 0's plan of it.

Each rank keeps its own copy of every request the replica is running (``RankSteps.jobs``, by a handle
rank 0 gives out). A newly admitted request arrives as rank 0's ``DiffusionJob`` pickled right after
validation, before any tensor work (its generator's state included), so every rank's copy encodes the
same prompt and draws the same noise; from then on every rank applies the same updates to it. Rank 0's
engine never reads the copies' tensors: the leader (leader.py) copies each step's outcome back.
"""

from __future__ import annotations

import pickle
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageError
from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.parallel.group import RankGroup
from omnistage.stages.diffusion.parallel.rows import CfgParallel
from omnistage.stages.diffusion.parallel.ulysses import enable_ulysses
from omnistage.stages.diffusion.runner import StepResult, advance, predict_rows, prepare


class NewJob(msgspec.Struct):
    handle: int
    job: bytes  # the pickled DiffusionJob, validated and not yet prepared


class StepPlan(msgspec.Struct):
    """One step of the replica: forget ``drop``, admit ``new``, then one forward over ``batch`` (handles, in
    forward order). ``stop``: leave the group."""

    batch: list[int] = []
    new: list[NewJob] = []
    drop: list[int] = []
    stop: bool = False


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StepPlan)


def encode(plan: StepPlan) -> bytes:
    return _encoder.encode(plan)


def decode(data: bytes) -> StepPlan:
    return _decoder.decode(data)


def parallelize(adapter: DiffusionAdapter, group: RankGroup, ctx: StageContext) -> None:
    """Put the layout's sequence parallelism into the adapter's denoisers (CFG parallelism is per step).
    A model that cannot be split is a start-up error naming the field and the pipeline."""
    if group.ulysses_mesh is None:
        return
    where = f"stages[{ctx.spec.stage_id}].parallel_config.ulysses_degree"
    models = adapter.denoisers()
    if not models:
        raise ValueError(
            f"{where}: pipeline {ctx.pipeline_name!r} ({type(adapter).__name__}) names no denoiser "
            "to split over the sequence"
        )
    for model in models:
        try:
            enable_ulysses(model, group.rank, group.ulysses_mesh, group.device)
        except ValueError as e:
            raise ValueError(f"{where}: pipeline {ctx.pipeline_name!r}: {e}") from None


class RankSteps:
    def __init__(self, adapter: DiffusionAdapter, group: RankGroup):
        self.adapter = adapter
        self.group = group
        self.decode = group.rank == 0  # only rank 0 answers; the others keep their copies undecoded
        self.predict = CfgParallel(group) if group.layout.cfg > 1 else predict_rows
        self.jobs: dict[int, DiffusionJob] = {}
        self._handles: dict[int, int] = {}  # id(copy) -> handle

    def handle(self, job: DiffusionJob) -> int:
        return self._handles[id(job)]

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        torch.get_num_threads()  # per-thread OpenMP setup before the first GEMM (runner.run_step says why)
        for h in plan.drop:
            job = self.jobs.pop(h, None)
            if job is not None:
                self._handles.pop(id(job), None)
        new = []
        for n in plan.new:
            job = pickle.loads(n.job)
            self.jobs[n.handle] = job
            self._handles[id(job)] = n.handle
            new.append(job)
        result = StepResult()
        prepare(self.adapter, new, result)
        failed = self._agree_failures(result) if plan.new else set()
        jobs = [self.jobs[h] for h in plan.batch if h not in failed]
        if jobs:
            advance(self.adapter, jobs, result, None, predict=self.predict, decode=self.decode)
        return result

    def _agree_failures(self, result: StepResult) -> set[int]:
        """Every rank drops the requests whose preparation failed on any rank (say, out of memory on one),
        so the forward's rows agree; on rank 0 they fail with the other rank's error."""
        mine = {self.handle(j): err.message for j, err in result.failed}
        everyone: list[Any] = [None] * self.group.layout.world
        dist.all_gather_object(everyone, mine, group=self.group.control)
        failed = {h for d in everyone for h in d}
        known = {self.handle(j) for j, _ in result.failed}
        for rank, d in enumerate(everyone):
            for h, message in d.items():
                if h not in known:
                    result.failed.append((self.jobs[h], StageError(f"rank {rank}: {message}")))
                    known.add(h)
        return failed
