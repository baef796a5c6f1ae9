"""A rank other than 0 of a multi-device replica, in its own process: load the model, join the group,
then run every step rank 0 plans until told to stop. Any exception ends the process (with its
traceback on stderr): the ranks could no longer be trusted to agree, and the launcher restarts them all."""

from __future__ import annotations

import pickle

import zmq

from omnistage.stages.lifetime import die_with_parent
from omnistage.stages.threads import apply_process_threads


def run_rank(payload: bytes, rank: int, parent: int) -> None:
    # first: a rank blocked in a collective checks nothing, so the kernel (or a thread) ends it with its launcher
    die_with_parent(parent)
    ctx = pickle.loads(payload)
    apply_process_threads(ctx.deploy.num_threads or 1)
    from omnistage.stages.diffusion.engine import load_adapter
    from omnistage.stages.diffusion.parallel.group import join, leave, rank_device
    from omnistage.stages.diffusion.parallel.steps import RankSteps, decode, parallelize

    info = ctx.group
    zctx = zmq.Context()
    plans = zctx.socket(zmq.PULL)
    plans.connect(info.plan_addrs[rank - 1])
    device = rank_device(ctx.devices, rank)
    adapter = load_adapter(ctx, device)
    group = join(info, rank, device)
    parallelize(adapter, group, ctx)
    steps = RankSteps(adapter, group)
    try:
        while True:
            plan = decode(plans.recv())
            if plan.stop:
                break
            steps.execute(plan)
    finally:
        plans.close(linger=0)
        zctx.term()
        leave()
