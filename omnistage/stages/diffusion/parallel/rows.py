"""CFG parallelism: a step's rows spread over the replica's two CFG halves, and gathered back.

The step's row layout is the single-device one (runner.py): the uncond rows of every CFG request, then
the cond rows of every request. Half 0 computes all the uncond rows, half 1 the cond rows of the CFG
requests, and the rows of requests without CFG are cut in two (at row granularity, so one request of
four images splits 2 + 2). Each half runs ``runner.predict_rows`` on its part (with ``ulysses_degree``
> 1 the ranks of a half run it together); the parts are all-gathered across the halves and put back in
layout order, so every rank applies guidance and the sampler step to the same full set of rows. A step
with one row and no CFG is computed by both halves (nothing to split).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from omnistage.stages.diffusion.adapter import DiffusionAdapter, DiffusionJob
from omnistage.stages.diffusion.parallel.group import RankGroup
from omnistage.stages.diffusion.runner import predict_rows


@dataclass
class Share:
    """One half's part of a step: whose uncond rows, then whose cond rows (whole requests or row slices of
    requests without CFG), and where those rows sit in the step's layout, in this order."""

    uncond: list[DiffusionJob]
    cond: list[DiffusionJob]
    rows: list[int]


def _slice_rows(job: DiffusionJob, start: int, stop: int) -> DiffusionJob:
    """A view of rows ``start:stop`` of a request: its conditioning cut to them (nothing else is read)."""
    if start == 0 and stop == job.rows:
        return job
    cond = {k: v[start:stop] for k, v in job.cond.items()}
    return dataclasses.replace(job, rows=stop - start, cond=cond, uncond=None)


def split(uncond: list[DiffusionJob], cond: list[DiffusionJob]) -> list[Share] | None:
    """The two halves' shares of a step's rows; None when there is nothing to split (one row, no CFG)."""
    n_uncond = sum(j.rows for j in uncond)
    cfg_ids = {id(j) for j in uncond}
    halves = [Share(list(uncond), [], list(range(n_uncond))), Share([], [], [])]
    plain: list[tuple[DiffusionJob, int, int]] = []  # (request, its row, the row's place in the layout)
    pos = n_uncond
    for j in cond:
        if id(j) in cfg_ids:
            halves[1].cond.append(j)
            halves[1].rows.extend(range(pos, pos + j.rows))
        else:
            plain.extend((j, r, pos + r) for r in range(j.rows))
        pos += j.rows
    if not uncond and len(plain) < 2:
        return None
    cut = (len(plain) + 1) // 2
    for half, part in ((halves[0], plain[:cut]), (halves[1], plain[cut:])):
        i = 0
        while i < len(part):  # consecutive rows of one request become one slice
            job, first, _ = part[i]
            k = i
            while k + 1 < len(part) and part[k + 1][0] is job:
                k += 1
            half.cond.append(_slice_rows(job, first, part[k][1] + 1))
            half.rows.extend(p for _, _, p in part[i : k + 1])
            i = k + 1
    return halves


class CfgParallel:
    """``runner.Predict`` for a replica with ``cfg_parallel_size`` 2."""

    def __init__(self, group: RankGroup):
        self.group = group

    def __call__(
        self,
        adapter: DiffusionAdapter,
        hooks: object,
        uncond: list[DiffusionJob],
        cond: list[DiffusionJob],
        x: torch.Tensor,
        t: torch.Tensor,
    ) -> torch.Tensor:
        halves = split(uncond, cond)
        if halves is None:
            return predict_rows(adapter, hooks, uncond, cond, x, t)
        mine = halves[self.group.cfg_index]
        idx = torch.tensor(mine.rows, device=x.device)
        out = predict_rows(adapter, hooks, mine.uncond, mine.cond, x.index_select(0, idx), t.index_select(0, idx))
        # all-gather needs equal sizes: each half's rows padded to the larger count
        most = max(len(h.rows) for h in halves)
        buf = out.new_zeros((most, *out.shape[1:]))
        buf[: out.shape[0]] = out
        parts = [torch.empty_like(buf) for _ in halves]
        dist.all_gather(parts, buf, group=self.group.cfg_group)
        gathered = torch.cat([p[: len(h.rows)] for p, h in zip(parts, halves)])
        order = torch.tensor([r for h in halves for r in h.rows], device=x.device)
        return torch.empty_like(gathered).index_copy_(0, order, gathered)
