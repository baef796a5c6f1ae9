"""Child-process side of an ``mp`` stage: runs the stage's inline engine and
serves it over two ZeroMQ sockets (commands in, outputs out)."""

from __future__ import annotations

import asyncio
import os
import pickle
import traceback
from typing import Any

import zmq
import zmq.asyncio

from omnistage.stages.base import StageEngine, StageRequest
from omnistage.stages.threads import apply_process_threads
from omnistage.transport.codec import Codec

STATS_INTERVAL_S = 0.5


def run_worker(ctx_bytes: bytes, cmd_addr: str, out_addr: str) -> None:
    ctx = pickle.loads(ctx_bytes)
    # One thread by default: several stage processes share the machine's cores.
    apply_process_threads(ctx.deploy.num_threads or 1)
    asyncio.run(_serve(ctx, cmd_addr, out_addr))


async def _serve(ctx: Any, cmd_addr: str, out_addr: str) -> None:
    from omnistage.stages.factory import build_inline_engine

    codec = Codec(ctx.shm_threshold)
    encode, decode = codec.encode, codec.decode

    zctx = zmq.asyncio.Context()
    cmd = zctx.socket(zmq.PULL)
    cmd.connect(cmd_addr)
    out = zctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 1000)
    out.connect(out_addr)
    parent = os.getppid()
    try:
        try:
            engine = build_inline_engine(ctx)
            await engine.start()
        except BaseException as e:
            await out.send(encode({"type": "start_failed", "error": f"{type(e).__name__}: {e}",
                                   "traceback": traceback.format_exc()}))
            return
        await out.send(encode({"type": "ready"}))
        tasks: dict[str, asyncio.Task] = {}
        stats_task = asyncio.create_task(_report_stats(engine, out, parent, encode))
        try:
            while True:
                msg = decode(await cmd.recv())
                kind = msg["type"]
                if kind == "generate":
                    req = StageRequest(msg["request_id"], msg["inputs"], msg["params"], msg["stream_inputs"])
                    tasks[req.request_id] = asyncio.create_task(_run_request(engine, req, out, tasks, encode))
                elif kind == "feed":
                    await engine.feed(msg["request_id"], msg["chunk"], msg["last"])
                elif kind == "abort":
                    await engine.abort(msg["request_id"])
                elif kind == "shutdown":
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


async def _run_request(engine: StageEngine, req: StageRequest, out: zmq.asyncio.Socket, tasks: dict, encode) -> None:
    try:
        async for o in engine.generate(req):
            await out.send(encode({"type": "output", "output": o}))
    except ValueError as e:  # the engine's own validation of the request
        await out.send(encode({"type": "error", "request_id": req.request_id, "error": str(e), "bad_input": True}))
    except Exception as e:
        await out.send(encode({"type": "error", "request_id": req.request_id, "error": f"{type(e).__name__}: {e}",
                               "bad_input": False}))
    finally:
        tasks.pop(req.request_id, None)


async def _report_stats(engine: StageEngine, out: zmq.asyncio.Socket, parent: int, encode) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL_S)
        if os.getppid() != parent:  # the parent died: do not linger as an orphan
            os._exit(1)
        await out.send(encode({"type": "stats", "stats": engine.stats()}))
