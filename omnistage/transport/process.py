"""Parent-process side of an ``mp`` stage: the real engine runs in a spawned
child process (worker.py); commands and outputs are typed messages
(messages.py) over two ZeroMQ ipc sockets. Death, restart and per-request
routing are RemoteStageEngine's (remote.py)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import tempfile
import uuid
from typing import Any

import zmq
import zmq.asyncio

from omnistage.errors import StageUnavailableError
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.lifetime import run_in_spawner
from omnistage.transport.codec import Codec
from omnistage.transport.messages import (
    Abort,
    Event,
    Feed,
    Generate,
    Output,
    Ready,
    Shutdown,
    StartFailed,
    Stats,
)
from omnistage.transport.remote import RemoteStageEngine
from omnistage.transport.worker import run_worker

START_TIMEOUT_S = 600.0
WATCH_INTERVAL_S = 0.2
SEND_CHECK_S = 0.2  # how often a blocked send looks whether its child is still alive


class ProcessStageEngine(RemoteStageEngine):
    what = "process"

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self._proc: mp.process.BaseProcess | None = None
        self._zctx: zmq.asyncio.Context | None = None
        self._cmd: zmq.asyncio.Socket | None = None
        self._out: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._codec = Codec(Event, ctx.shm_threshold)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def _launch(self, payload: bytes) -> None:
        base = os.path.join(tempfile.gettempdir(), f"omnistage-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        cmd_addr, out_addr = f"ipc://{base}-cmd", f"ipc://{base}-out"
        self._zctx = zmq.asyncio.Context()
        self._cmd = self._zctx.socket(zmq.PUSH)
        self._cmd.bind(cmd_addr)
        self._out = self._zctx.socket(zmq.PULL)
        self._out.bind(out_addr)
        self._proc = mp.get_context("spawn").Process(
            target=run_worker,
            args=(payload, cmd_addr, out_addr, os.getpid()),
            name=f"omnistage-stage{self.stage_id}-r{self.ctx.replica}",
            daemon=True,
        )
        await run_in_spawner(self._proc.start)  # the child dies with this process (stages/lifetime.py)
        first = await self._first_event()
        if not isinstance(first, Ready):
            await self._stop()
            raise RuntimeError(
                f"stage {self.stage_id} failed to start in its process: {first.error}\n{first.traceback}"
            )
        self._reader = asyncio.create_task(self._read(), name=f"stage{self.stage_id}-read")

    async def _first_event(self) -> Ready | StartFailed:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while loop.time() < deadline:
            if await self._out.poll(200):
                return self._codec.decode(await self._out.recv())
            if not self._proc.is_alive():
                return StartFailed(f"process exited with code {self._proc.exitcode}")
        return StartFailed(f"not ready after {START_TIMEOUT_S:.0f} s")

    async def _read(self) -> None:
        while True:
            msg = self._codec.decode(await self._out.recv())
            if isinstance(msg, Output):
                self._deliver(msg.output)
            elif isinstance(msg, Stats) and not self._dead:
                self._stats = msg.stats

    async def _until_dead(self) -> str:
        while self._proc.is_alive():
            await asyncio.sleep(WATCH_INTERVAL_S)
        return f"exit code {self._proc.exitcode}"

    async def _send(self, msg: Any) -> None:
        """Send a command to the child. A PUSH whose peer has just died blocks until a new peer connects
        (never, on this socket), and the watcher may not have seen the death yet: so the send waits only while
        the child lives, and a dead child is this request's StageUnavailableError (503), not a hang."""
        sock, proc = self._cmd, self._proc
        if sock is None or proc is None:
            raise StageUnavailableError(f"stage {self.stage_id} process is not running")
        send = asyncio.ensure_future(sock.send(self._codec.encode(msg)))
        try:
            while not send.done():
                await asyncio.wait({send}, timeout=SEND_CHECK_S)
                if not send.done() and not proc.is_alive():
                    raise StageUnavailableError(f"stage {self.stage_id} process died (exit code {proc.exitcode})")
            if send.cancelled() or send.exception() is not None:  # the socket was closed under it (restart)
                raise StageUnavailableError(f"stage {self.stage_id} process is restarting")
        finally:
            send.cancel()  # no-op once sent; otherwise the message must not reach a later peer

    async def _submit(self, req: StageRequest) -> None:
        await self._send(Generate(req))

    async def _send_feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        await self._send(Feed(request_id, chunk, last))

    async def _send_abort(self, request_id: str) -> None:
        await self._send(Abort(request_id))

    async def _stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.is_alive():
            try:
                await asyncio.wait_for(self._send(Shutdown()), 1.0)
            except (TimeoutError, zmq.ZMQError, StageUnavailableError):
                pass
            for stop in (None, proc.terminate, proc.kill):  # ask, then insist
                if stop is not None:
                    stop()
                await asyncio.to_thread(proc.join, 10 if stop is None else 5)
                if not proc.is_alive():
                    break
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        for sock in (self._cmd, self._out):
            if sock is not None:
                sock.close(linger=0)
        self._cmd = self._out = None
        if self._zctx is not None:
            self._zctx.term()
            self._zctx = None
