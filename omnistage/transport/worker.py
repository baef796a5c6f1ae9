"""Child-process side of an ``mp`` stage: runs the stage's inline engine and
serves it over two ZeroMQ sockets (commands in, outputs out)."""

from __future__ import annotations

import asyncio
import pickle
import traceback
from typing import Any

import zmq
import zmq.asyncio

from omnistage.stages.base import StageEngine, StageRequest
from omnistage.stages.inline import build_inline_engine
from omnistage.stages.lifetime import die_with_parent
from omnistage.stages.threads import apply_process_threads
from omnistage.transport.codec import Codec
from omnistage.transport.messages import (
    Abort,
    Command,
    Feed,
    Generate,
    Output,
    Ready,
    Shutdown,
    StartFailed,
    Stats,
)
from omnistage.transport.remote import serve_request

STATS_INTERVAL_S = 0.5


def run_worker(ctx_bytes: bytes, cmd_addr: str, out_addr: str, parent: int) -> None:
    die_with_parent(parent)  # first: a parent killed while this child loads its model takes it along
    ctx = pickle.loads(ctx_bytes)
    # One thread by default: several stage processes share the machine's cores.
    apply_process_threads(ctx.deploy.num_threads or 1)
    asyncio.run(_serve(ctx, cmd_addr, out_addr))


async def _serve(ctx: Any, cmd_addr: str, out_addr: str) -> None:
    codec = Codec(Command, ctx.shm_threshold)
    zctx = zmq.asyncio.Context()
    cmd = zctx.socket(zmq.PULL)
    cmd.connect(cmd_addr)
    out = zctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 1000)
    out.connect(out_addr)

    async def send(msg: Any) -> None:
        await out.send(codec.encode(msg))

    try:
        try:
            engine = build_inline_engine(ctx)
            await engine.start()
        except BaseException as e:
            await send(StartFailed(f"{type(e).__name__}: {e}", traceback.format_exc()))
            return
        await send(Ready())
        tasks: dict[str, asyncio.Task] = {}
        stats_task = asyncio.create_task(_report_stats(engine, send))
        try:
            while True:
                msg = codec.decode(await cmd.recv())
                if isinstance(msg, Generate):
                    rid = msg.request.request_id
                    tasks[rid] = asyncio.create_task(_run_request(engine, msg.request, ctx.spec.stage_id, send, tasks))
                elif isinstance(msg, Feed):
                    await engine.feed(msg.request_id, msg.chunk, msg.last)
                elif isinstance(msg, Abort):
                    await engine.abort(msg.request_id)
                elif isinstance(msg, Shutdown):
                    break
        finally:
            stats_task.cancel()
            for t in tasks.values():
                t.cancel()
            await engine.shutdown()
    finally:
        out.close()
        cmd.close(linger=0)
        zctx.term()


async def _run_request(engine: StageEngine, req: StageRequest, stage_id: int, send: Any, tasks: dict) -> None:
    try:
        async for o in serve_request(engine, req, stage_id):
            await send(Output(o))
    finally:
        tasks.pop(req.request_id, None)


async def _report_stats(engine: StageEngine, send: Any) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL_S)
        await send(Stats(engine.stats()))
