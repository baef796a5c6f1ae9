"""``ray`` stages: each stage replica is a Ray actor running the stage's inline engine.

The actor is placed by resource request (``runtime.num_gpus`` / ``num_cpus``,
default: one GPU per device of the replica when it has devices, no CPU
reservation) and the stage's ``placement`` (Ray label selector and custom
resources; default anywhere) in the Ray cluster ``RAY_ADDRESS`` points at (or a
local one); a placement the live nodes cannot hold, or only on nodes too small
for the stage by the memory plan, is refused before the actor is created
(ray_placement.py). Requests stream back through a Ray streaming generator; tensors travel in
the Ray object store. vLLM stages keep their own engine-core process inside
the actor (vLLM's Ray executor refuses the CPU platform). Death, restart and
per-request routing are RemoteStageEngine's (remote.py). Stage code must be
importable on every node (install omnistage and the model families there).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
from dataclasses import replace
from typing import Any

from omnistage.memory_plan import stage_need
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageError, StageOutput, StageRequest, StageStats
from omnistage.transport.ray_placement import check_placement
from omnistage.transport.remote import RemoteStageEngine, serve_request

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5
PLACEMENT_RECHECK_S = 5.0  # while an actor starts: how often its placement is checked against the live nodes


class StageActor:
    """The actor body (wrapped by ``ray.remote`` lazily, so importing omnistage never imports Ray)."""

    def __init__(self, ctx_bytes: bytes):
        from omnistage.stages.inline import build_inline_engine
        from omnistage.stages.threads import apply_process_threads

        ctx = pickle.loads(ctx_bytes)
        apply_process_threads(ctx.deploy.num_threads or 1)  # actors share their node's cores
        self.engine = build_inline_engine(ctx)
        self.stage_id = ctx.spec.stage_id

    async def start(self) -> None:
        await self.engine.start()

    async def generate(self, req: StageRequest):
        async for out in serve_request(self.engine, req, self.stage_id):
            yield out

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        await self.engine.feed(request_id, chunk, last)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def stats(self) -> StageStats:
        return self.engine.stats()

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


@functools.cache
def _remote_class() -> Any:
    import ray

    return ray.remote(StageActor)


def ensure_ray() -> None:
    """Connect to the cluster at ``RAY_ADDRESS`` (e.g. one started with ``ray start --head``), or start a
    local one."""
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "distributed_executor_backend: ray (or process: ray) needs the ray package: pip install 'omnistage[ray]'"
        ) from None
    if not ray.is_initialized():
        ray.init(
            address=os.environ.get("RAY_ADDRESS") or None,
            log_to_driver=False,
            include_dashboard=False,
            ignore_reinit_error=True,
        )


class RayStageEngine(RemoteStageEngine):
    what = "Ray actor"

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.actor: Any = None
        self.node_id: str | None = None  # the Ray node the live actor runs on
        self.unplaceable = False  # the last placement check found no live node that can hold the stage
        self._pumps: dict[str, asyncio.Task] = {}

    def _resources(self) -> dict[str, float]:
        rt = self.ctx.deploy.runtime
        gpus = (
            rt.num_gpus
            if rt and rt.num_gpus is not None
            else (len(self.ctx.devices) if self.ctx.devices and self.ctx.devices != ["cpu"] else 0)
        )
        cpus = rt.num_cpus if rt and rt.num_cpus is not None else 0
        return {"num_gpus": gpus, "num_cpus": cpus}

    def _options(self) -> dict[str, Any]:
        """``.options()`` of the actor: its resource request plus the stage's ``placement`` as Ray takes it."""
        opts: dict[str, Any] = self._resources()
        pl = self.ctx.deploy.placement
        if pl is not None and pl.resources:
            opts["resources"] = dict(pl.resources)
        if pl is not None and pl.label_selector:
            opts["label_selector"] = dict(pl.label_selector)
        return opts

    @functools.cached_property
    def _memory_need(self) -> tuple[int, str] | None:
        """What one device of this stage needs by the memory plan (read off the weights' headers once)."""
        gpu = self._resources()["num_gpus"] > 0
        try:
            return stage_need(self.ctx.spec, self.ctx.deploy, self.ctx.model, gpu)
        except (OSError, ValueError, KeyError) as e:  # a folder the plan cannot read: the stage's load will say
            logger.warning("stage %s: no memory plan for its placement (%s)", self.stage_id, e)
            return None

    def _check_placement(self) -> None:
        import ray

        opts = self._options()
        demand = {"GPU": opts["num_gpus"], "CPU": opts["num_cpus"], **opts.get("resources", {})}
        self.unplaceable = True
        check_placement(
            f"stage {self.stage_id}",
            self.ctx.deploy.replicas,
            opts.get("label_selector", {}),
            demand,
            ray.nodes(),
            self._memory_need,
        )
        self.unplaceable = False

    def payload(self) -> bytes:
        # Ray hands the actor its GPUs (CUDA_VISIBLE_DEVICES): device ids from this machine mean nothing there.
        if self._resources()["num_gpus"]:
            return pickle.dumps(replace(self.ctx, devices=None))
        return super().payload()

    async def _launch(self, payload: bytes) -> None:
        import ray

        await asyncio.to_thread(ensure_ray)
        await asyncio.to_thread(self._check_placement)
        actor = _remote_class().options(**self._options()).remote(payload)
        start = asyncio.ensure_future(actor.start.remote())
        try:
            while not (await asyncio.wait({start}, timeout=PLACEMENT_RECHECK_S))[0]:
                # not started yet: the nodes that passed the check may have gone since (a lost node is seen
                # alive for a while), and Ray keeps an actor no live node can take pending forever
                await asyncio.to_thread(self._check_placement)
            start.result()
        except asyncio.CancelledError:  # the stage stops while this actor starts (mid-restart): end it too
            start.cancel()
            ray.kill(actor)
            raise
        except Exception as e:
            start.cancel()
            ray.kill(actor)
            raise RuntimeError(
                f"stage {self.stage_id} (replica {self.ctx.replica}) failed to start as a Ray actor: {e}"
            ) from None
        self.actor = actor
        self.node_id = await actor.node_id.remote()

    async def _until_placeable(self) -> bool:
        """Down after its restarts failed because no live node could hold it: back once one can (a node
        rejoined, or one with the labels and resources it asks for was added). Failed for another reason (its
        engine does not start): it stays down."""
        if not self.unplaceable:
            return False
        while not self._closing:
            await asyncio.sleep(PLACEMENT_RECHECK_S)
            try:
                await asyncio.to_thread(self._check_placement)
            except RuntimeError:
                continue
            return True
        return False

    async def _until_dead(self) -> str:
        """Poll the actor's stats; a failed poll means the actor died."""
        import ray

        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                self._stats = await self.actor.stats.remote()
            except ray.exceptions.RayActorError as e:
                return f"{type(e).__name__}; replica {self.ctx.replica} was on Ray node {self.node_id}"

    async def _submit(self, req: StageRequest) -> None:
        import ray

        async def pump() -> None:
            stream = None
            try:
                stream = self.actor.generate.options(num_returns="streaming").remote(req)
                async for ref in stream:
                    self._deliver(await ref)
            except ray.exceptions.RayActorError:
                pass  # the watcher reports it (and restarts the actor)
            except Exception as e:  # noqa: BLE001 - e.g. the object store: this request fails alone
                self._deliver(StageOutput(req.request_id, self.stage_id, {}, True, error=StageError.failure(e)))
            finally:
                self._pumps.pop(req.request_id, None)
                # released now, while Ray is up: a caught error's traceback keeps this frame alive until a
                # garbage collection, and a dead actor's stream freed only at interpreter exit (after Ray's core
                # worker is gone) made the server abort after a clean shutdown (benchmarks/results/chaos.md)
                del stream

        self._pumps[req.request_id] = asyncio.create_task(pump(), name=f"ray-{req.request_id}")

    async def _send_feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        await self.actor.feed.remote(request_id, chunk, last)

    async def _send_abort(self, request_id: str) -> None:
        import ray

        try:
            await self.actor.abort.remote(request_id)
        except ray.exceptions.RayActorError:
            pass  # dead already: the watcher fails its requests

    async def pid(self) -> int:
        return await self.actor.pid.remote()

    async def _stop(self) -> None:
        import ray

        for task in list(self._pumps.values()):
            task.cancel()
        if self.actor is None:
            return
        try:
            await asyncio.wait_for(self.actor.shutdown.remote(), 30)
        except Exception:  # noqa: BLE001 - already dead or stuck: killed below either way
            pass
        ray.kill(self.actor)
        self.actor = None
