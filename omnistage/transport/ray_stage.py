"""``ray`` stages: each stage replica is a Ray actor running the stage's inline engine.

The actor is placed by resource request (``runtime.num_gpus`` / ``num_cpus``,
default: one GPU per device of the replica when it has devices, no CPU
reservation), anywhere in the Ray cluster ``RAY_ADDRESS`` points at (or a local
one). Requests stream back through a Ray streaming generator; tensors travel in
the Ray object store. vLLM stages keep their own engine-core process inside
the actor (vLLM's Ray executor refuses the CPU platform).

If the actor dies, every request in flight on it fails with a clear error, the
stage reports itself unhealthy, and a new actor is started. Stage code must be
importable on every node (install omnistage and the model families there).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
from typing import Any, AsyncIterator

from omnistage.pipeline import StageContext
from omnistage.stages.base import StageOutput, StageRequest, StageStats

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5


class StageActor:
    """The actor body (wrapped by ``ray.remote`` lazily, so importing omnistage never imports Ray)."""

    def __init__(self, ctx_bytes: bytes):
        from omnistage.stages.factory import build_inline_engine
        from omnistage.stages.threads import apply_process_threads

        ctx = pickle.loads(ctx_bytes)
        apply_process_threads(ctx.deploy.num_threads or 1)  # actors share their node's cores
        self.engine = build_inline_engine(ctx)
        self.stage_id = ctx.spec.stage_id

    async def start(self) -> None:
        await self.engine.start()

    async def generate(self, req: StageRequest):
        try:
            async for out in self.engine.generate(req):
                yield out
        except ValueError as e:  # the engine's own validation of the request
            yield StageOutput(req.request_id, self.stage_id, {}, True, error=str(e), bad_input=True)
        except Exception as e:
            yield StageOutput(req.request_id, self.stage_id, {}, True, error=f"{type(e).__name__}: {e}")

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        await self.engine.feed(request_id, chunk, last)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> StageStats:
        return self.engine.stats()

    def pid(self) -> int:
        return os.getpid()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


@functools.lru_cache(maxsize=None)
def _remote_class() -> Any:
    import ray

    return ray.remote(StageActor)


def ensure_ray() -> None:
    """Connect to the cluster at ``RAY_ADDRESS`` (e.g. one started with ``ray start --head``), or start a
    local one."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("distributed_executor_backend: ray (or process: ray) needs the ray package: "
                           "pip install 'omnistage[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False,
                 include_dashboard=False, ignore_reinit_error=True)


class RayStageEngine:
    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.stage_id = ctx.spec.stage_id
        self.actor: Any = None
        self.restarts = 0
        self._stats = StageStats(healthy=False, detail="starting")
        self._dead: str | None = None
        self._closing = False
        self._running: dict[str, asyncio.Queue] = {}
        self._watch_task: asyncio.Task | None = None

    def _resources(self) -> dict[str, float]:
        rt = self.ctx.deploy.runtime
        gpus = rt.num_gpus if rt and rt.num_gpus is not None else (
            len(self.ctx.devices) if self.ctx.devices and self.ctx.devices != ["cpu"] else 0)
        cpus = rt.num_cpus if rt and rt.num_cpus is not None else 0
        return {"num_gpus": gpus, "num_cpus": cpus}

    async def start(self) -> None:
        await asyncio.to_thread(ensure_ray)
        await self._launch()
        self._watch_task = asyncio.create_task(self._watch())

    async def _launch(self) -> None:
        from dataclasses import replace

        # Ray hands the actor its GPUs (CUDA_VISIBLE_DEVICES): device ids from this machine mean nothing there.
        ctx = replace(self.ctx, devices=None) if self._resources()["num_gpus"] else self.ctx
        try:
            payload = pickle.dumps(ctx)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ValueError(f"stage {self.stage_id}: cannot run as a Ray actor: its declaration is not picklable "
                             f"({e}); use module-level functions and classes") from None
        actor = _remote_class().options(**self._resources()).remote(payload)
        try:
            await actor.start.remote()
        except Exception as e:
            import ray

            ray.kill(actor)
            raise RuntimeError(f"stage {self.stage_id} (replica {self.ctx.replica}) failed to start as a Ray actor: "
                               f"{e}") from None
        self.actor = actor
        self._stats = StageStats()

    async def _watch(self) -> None:
        """Poll the actor's stats; a failed poll means the actor died: fail its requests and restart it."""
        import ray

        while not self._closing:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self._stats = await self.actor.stats.remote()
                continue
            except ray.exceptions.RayActorError as e:
                if self._closing:
                    return
                self._dead = f"stage {self.stage_id} Ray actor died ({type(e).__name__})"
            logger.error("%s; restarting it", self._dead)
            self._stats = StageStats(healthy=False, detail=self._dead)
            for rid, q in list(self._running.items()):
                q.put_nowait(StageOutput(rid, self.stage_id, {}, True, error=self._dead))
            self.restarts += 1
            try:
                await self._launch()
            except Exception:
                logger.exception("stage %s could not be restarted", self.stage_id)
                self._stats = StageStats(healthy=False, detail=f"{self._dead}; restart failed")
                return
            self._dead = None

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        import ray

        if self._dead:
            raise RuntimeError(self._dead)
        q: asyncio.Queue = asyncio.Queue()
        self._running[req.request_id] = q

        async def pump() -> None:
            try:
                async for ref in self.actor.generate.options(num_returns="streaming").remote(req):
                    q.put_nowait(await ref)
            except ray.exceptions.RayActorError:
                pass  # the watcher reports it (and restarts the actor)
            except Exception as e:
                q.put_nowait(StageOutput(req.request_id, self.stage_id, {}, True, error=f"{type(e).__name__}: {e}"))

        task = asyncio.create_task(pump())
        finished = False
        try:
            while True:
                out = await q.get()
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            self._running.pop(req.request_id, None)
            if not finished and not self._dead:
                await self.abort(req.request_id)  # closed early by the consumer
            task.cancel()

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        if not self._dead:
            await self.actor.feed.remote(request_id, chunk, last)

    async def abort(self, request_id: str) -> None:
        import ray

        if not self._dead and self.actor is not None:
            try:
                await self.actor.abort.remote(request_id)
            except ray.exceptions.RayActorError:
                pass

    def stats(self) -> StageStats:
        return self._stats

    async def pid(self) -> int:
        return await self.actor.pid.remote()

    async def shutdown(self) -> None:
        import ray

        self._closing = True
        if self._watch_task is not None:
            self._watch_task.cancel()
            await asyncio.gather(self._watch_task, return_exceptions=True)
        for rid, q in list(self._running.items()):
            q.put_nowait(StageOutput(rid, self.stage_id, {}, True, error="stage shut down"))
        if self.actor is not None:
            try:
                await asyncio.wait_for(self.actor.shutdown.remote(), 30)
            except Exception:  # already dead or stuck: kill it below either way
                pass
            ray.kill(self.actor)
            self.actor = None
        self._stats = StageStats(healthy=False, detail="shut down")
