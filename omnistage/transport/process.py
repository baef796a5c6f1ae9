"""Parent-process side of an ``mp`` stage: a StageEngine that runs the real
engine in a spawned child process, with control over ZeroMQ (msgspec).

If the child dies, every request in flight on it fails with a clear error,
the stage reports itself unhealthy, and the replica is restarted.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import pickle
import tempfile
import uuid
from typing import Any, AsyncIterator

import zmq
import zmq.asyncio

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageMetrics, StageOutput, StageRequest, StageStats
from omnistage.transport.codec import Codec
from omnistage.transport.worker import run_worker

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0
WATCH_INTERVAL_S = 0.2


class ProcessStageEngine:
    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.stage_id = ctx.spec.stage_id
        self._proc: mp.process.BaseProcess | None = None
        self._zctx: zmq.asyncio.Context | None = None
        self._cmd: zmq.asyncio.Socket | None = None
        self._out: zmq.asyncio.Socket | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._tasks: list[asyncio.Task] = []
        self._stats = StageStats(healthy=False, detail="starting")
        self._dead: str | None = None
        self._closing = False
        self.restarts = 0
        self._codec = Codec(ctx.shm_threshold)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        await self._spawn()
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch())]

    async def _spawn(self) -> None:
        base = os.path.join(tempfile.gettempdir(), f"omnistage-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        cmd_addr, out_addr = f"ipc://{base}-cmd", f"ipc://{base}-out"
        self._zctx = zmq.asyncio.Context()
        self._cmd = self._zctx.socket(zmq.PUSH)
        self._cmd.bind(cmd_addr)
        self._out = self._zctx.socket(zmq.PULL)
        self._out.bind(out_addr)
        try:
            payload = pickle.dumps(self.ctx)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ValueError(f"stage {self.stage_id}: cannot run in a child process (mp): its declaration is "
                             f"not picklable ({e}); use module-level functions and classes") from None
        self._proc = mp.get_context("spawn").Process(
            target=run_worker, args=(payload, cmd_addr, out_addr), name=f"omnistage-stage{self.stage_id}-r{self.ctx.replica}",
            daemon=True)
        self._proc.start()
        msg = await self._wait_ready()
        if msg["type"] != "ready":
            await self.shutdown()
            raise RuntimeError(f"stage {self.stage_id} failed to start in its process: {msg['error']}\n{msg.get('traceback', '')}")
        self._stats = StageStats()

    async def _wait_ready(self) -> dict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while loop.time() < deadline:
            if await self._out.poll(200):
                return self._codec.decode(await self._out.recv())
            if not self._proc.is_alive():
                return {"type": "start_failed", "error": f"process exited with code {self._proc.exitcode}"}
        return {"type": "start_failed", "error": f"not ready after {START_TIMEOUT_S:.0f} s"}

    async def _read(self) -> None:
        while True:
            msg = self._codec.decode(await self._out.recv())
            kind = msg["type"]
            if kind == "output":
                o = msg["output"]
                if o.get("metrics") is not None:
                    o["metrics"] = StageMetrics(**o["metrics"])
                if o.get("progress") is not None:
                    o["progress"] = tuple(o["progress"])
                out = StageOutput(**o)
                q = self._queues.get(out.request_id)
                if q is not None:
                    q.put_nowait(out)
            elif kind == "error":
                q = self._queues.get(msg["request_id"])
                if q is not None:
                    q.put_nowait(StageOutput(msg["request_id"], self.stage_id, {}, True, error=msg["error"],
                                             bad_input=msg["bad_input"]))
            elif kind == "stats":
                self._stats = StageStats(**msg["stats"])

    async def _watch(self) -> None:
        while not self._closing:
            while self._proc.is_alive():
                await asyncio.sleep(WATCH_INTERVAL_S)
            if self._closing:
                return
            self._dead = f"stage {self.stage_id} process died (exit code {self._proc.exitcode})"
            logger.error("%s; restarting it", self._dead)
            self._stats = StageStats(healthy=False, detail=self._dead)
            for rid, q in list(self._queues.items()):
                q.put_nowait(StageOutput(rid, self.stage_id, {}, True, error=self._dead))
            self.restarts += 1
            reader = self._tasks[0]
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self._close_sockets()
            try:
                await self._spawn()
            except Exception:
                logger.exception("stage %s could not be restarted", self.stage_id)
                self._stats = StageStats(healthy=False, detail=f"{self._dead}; restart failed")
                return
            self._dead = None
            self._tasks[0] = asyncio.create_task(self._read())

    async def _send(self, msg: dict[str, Any]) -> None:
        await self._cmd.send(self._codec.encode(msg))

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        if self._dead:
            raise RuntimeError(self._dead)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[req.request_id] = q
        try:
            await self._send({"type": "generate", "request_id": req.request_id, "inputs": req.inputs,
                              "params": req.params, "stream_inputs": req.stream_inputs})
            while True:
                out = await q.get()
                yield out
                if out.finished:
                    return
        finally:
            self._queues.pop(req.request_id, None)

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        if not self._dead:
            await self._send({"type": "feed", "request_id": request_id, "chunk": chunk, "last": last})

    async def abort(self, request_id: str) -> None:
        if not self._dead:
            await self._send({"type": "abort", "request_id": request_id})

    def stats(self) -> StageStats:
        return self._stats

    async def shutdown(self) -> None:
        self._closing = True
        proc = self._proc
        if proc is not None and proc.is_alive():
            try:
                await asyncio.wait_for(self._send({"type": "shutdown"}), 1.0)
            except (asyncio.TimeoutError, zmq.ZMQError):
                pass
            await asyncio.to_thread(proc.join, 10)
            if proc.is_alive():
                proc.terminate()
                await asyncio.to_thread(proc.join, 5)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 5)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for rid, q in list(self._queues.items()):
            q.put_nowait(StageOutput(rid, self.stage_id, {}, True, error="stage shut down"))
        self._close_sockets()
        self._stats = StageStats(healthy=False, detail="shut down")

    def _close_sockets(self) -> None:
        for sock in (self._cmd, self._out):
            if sock is not None:
                sock.close(linger=0)
        self._cmd = self._out = None
        if self._zctx is not None:
            self._zctx.term()
            self._zctx = None
