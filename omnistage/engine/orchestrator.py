"""The orchestrator: runs one request through the pipeline's DAG.

Each needed stage gets a coroutine that waits for its inputs, submits a
StageRequest and accumulates the stage's deltas. Plain edges hand over the
source's whole output when it finishes; streaming edges (async chunk) start
the downstream stage at once and feed it chunks while the source generates.
Fan-in waits for every declared source. Only stages whose outputs are needed
for the requested modalities run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from omnistage.config.schema import DeployConfig
from omnistage.engine.request import OmniRequest
from omnistage.engine.stage_client import StageClient
from omnistage.errors import InvalidRequestError, StageFailedError, StageUnavailableError
from omnistage.modality import OutputAccumulator, OutputModality, normalize_keys
from omnistage.outputs import OmniRequestOutput, delta_output, final_output
from omnistage.pipeline import Edge, Pipeline, StageSpec
from omnistage.stages.base import StageError, StageMetrics, StageOutput, StageRequest

logger = logging.getLogger(__name__)

_DONE = object()  # end-of-stream marker on subscriber queues
_ABORTED = object()  # the caller aborted the request


@dataclass
class _StageRun:
    spec: StageSpec
    output_type: OutputModality
    acc: OutputAccumulator
    started: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    subscribers: list[asyncio.Queue] = field(default_factory=list)  # streaming edges downstream
    metrics: StageMetrics | None = None
    submitted: bool = False
    finish_reason: str | None = None
    num_tokens: int | None = None  # llm stages: the running count of generated tokens
    num_prompt_tokens: int | None = None
    progress: tuple[int, int] | None = None


@dataclass
class _Run:
    request: OmniRequest
    stages: dict[int, _StageRun]
    events: asyncio.Queue  # (stage_id, StageOutput | Exception) for the caller
    tasks: list[asyncio.Task] = field(default_factory=list)
    aborted: bool = False


class Orchestrator:
    def __init__(
        self,
        pipeline: Pipeline,
        deploy: DeployConfig,
        clients: dict[int, StageClient],
        output_types: dict[int, OutputModality],
        async_chunk: bool,
    ):
        self.pipeline = pipeline
        self.deploy = deploy
        self.clients = clients
        self.output_types = output_types
        self.async_chunk = async_chunk
        self._runs: dict[str, _Run] = {}

    # ------------------------------------------------------------------ planning

    def final_stages(self, modalities: OutputModality | None) -> list[int]:
        finals = [s.stage_id for s in self.pipeline.stages if s.final]
        if modalities is None:
            return finals
        wanted = [sid for sid in finals if self.output_types[sid] & modalities]
        missing = modalities
        for sid in wanted:
            missing &= ~self.output_types[sid]
        if missing:
            raise InvalidRequestError(
                "modalities",
                f"pipeline {self.pipeline.name!r} does not produce {missing}; "
                f"it produces {self.pipeline_output_modalities}",
            )
        return wanted

    @property
    def pipeline_output_modalities(self) -> OutputModality:
        out = OutputModality(0)
        for s in self.pipeline.stages:
            if s.final:
                out |= self.output_types[s.stage_id]
        return out

    def needed_stages(self, finals: list[int]) -> list[int]:
        needed: set[int] = set()
        todo = list(finals)
        while todo:
            sid = todo.pop()
            if sid not in needed:
                needed.add(sid)
                todo.extend(e.source for e in self.pipeline.stage(sid).inputs)
        return sorted(needed)

    def _streams(self, edge: Edge) -> bool:
        return self.async_chunk and edge.can_stream

    # ------------------------------------------------------------------ public

    async def generate(self, request: OmniRequest) -> AsyncIterator[OmniRequestOutput]:
        if request.request_id in self._runs:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already in flight")
        finals = self.final_stages(request.modalities)
        needed = self.needed_stages(finals)
        run = _Run(request, {}, asyncio.Queue())
        for sid in needed:
            spec = self.pipeline.stage(sid)
            run.stages[sid] = _StageRun(spec, self.output_types[sid], OutputAccumulator(spec.accumulation))
        # Subscribe streaming consumers before anything runs, so no delta is missed.
        pumps: list[tuple[Edge, int, asyncio.Queue]] = []
        for sid in needed:
            for edge in self.pipeline.stage(sid).inputs:
                if self._streams(edge):
                    q: asyncio.Queue = asyncio.Queue()
                    run.stages[edge.source].subscribers.append(q)
                    pumps.append((edge, sid, q))
        self._runs[request.request_id] = run
        wanted = set(finals)
        if len(needed) == 1 and not pumps:
            # One stage (e.g. a chat model): consume it right here. A task and a queue in between would
            # cost every streamed chunk one more event-loop hop, which shows up as TTFT under load.
            try:
                async with contextlib.aclosing(self._stage_outputs(run, needed[0])) as outs:
                    async for out in outs:
                        yield self._output(run, needed[0], finished=False, delta=out)
                yield self._output(run, needed[0], finished=True)
            except Exception as e:
                if run.aborted:  # the caller aborted it: end quietly, as the multi-stage path does
                    return
                raise self._request_error(run, needed[0], e) from None
            finally:
                await self._cleanup(run)
            return
        for sid in needed:
            run.tasks.append(asyncio.create_task(self._run_stage(run, sid), name=f"{request.request_id}/stage{sid}"))
        for edge, sid, q in pumps:
            run.tasks.append(
                asyncio.create_task(
                    self._pump(run, edge, sid, q), name=f"{request.request_id}/edge{edge.source}->{sid}"
                )
            )
        remaining = len(needed)
        try:
            while remaining:
                sid, item = await run.events.get()
                if item is _ABORTED:
                    return
                if isinstance(item, BaseException):
                    raise item
                if item is _DONE:
                    remaining -= 1
                    if sid in wanted:
                        yield self._output(run, sid, finished=True)
                    continue
                if sid in wanted:  # data, or a progress-only update (diffusion steps)
                    yield self._output(run, sid, finished=False, delta=item)
        finally:
            await self._cleanup(run)

    async def abort(self, request_id: str) -> None:
        run = self._runs.get(request_id)
        if run is not None:
            run.aborted = True
            run.events.put_nowait((-1, _ABORTED))
            await self._cleanup(run)

    def running_requests(self) -> list[str]:
        return list(self._runs)

    # ------------------------------------------------------------------ internals

    def _output(self, run: _Run, sid: int, finished: bool, delta: StageOutput | None = None) -> OmniRequestOutput:
        st = run.stages[sid]
        wanted = run.request.modalities
        keep = (st.output_type & wanted) if wanted is not None else st.output_type
        rid = run.request.request_id
        if not finished:
            return delta_output(
                request_id=rid,
                stage_id=sid,
                output_type=st.output_type,
                delta=delta.data,
                keep=keep,
                progress=delta.progress,
                num_tokens=st.num_tokens,
                num_prompt_tokens=st.num_prompt_tokens,
            )
        metrics = {k: s.metrics.to_dict() for k, s in run.stages.items() if s.metrics is not None}
        # The request's text is its text-writing llm source stage's (a thinker), whichever final stage reports: its
        # finish reason (a reply cut at max_tokens is "length" with or without speech after it) and its prompt's
        # token count
        source = next(
            (
                s
                for s in run.stages.values()
                if s.spec.knobs == "llm" and not s.spec.inputs and OutputModality.TEXT in s.output_type
            ),
            None,
        )
        out = final_output(
            request_id=rid,
            stage_id=sid,
            output_type=st.output_type,
            whole=st.acc.whole(),
            keep=keep,
            metrics=metrics,
            finish_reason=(source.finish_reason if source is not None else None) or st.finish_reason,
            num_tokens=st.num_tokens,
            progress=st.progress,
        )
        if out.num_prompt_tokens is None and source is not None:
            out.num_prompt_tokens = source.num_prompt_tokens
        return out

    def _stage_inputs(self, run: _Run, spec: StageSpec) -> dict[str, Any]:
        if not spec.inputs:
            return dict(run.request.prompt)
        inputs: dict[str, Any] = {}
        for edge in spec.inputs:
            if self._streams(edge):
                continue  # its data arrives through feed()
            source = run.stages[edge.source].acc.whole()  # assembled once, when the source finished
            inputs.update(edge.process(source, run.request) if edge.process else source)
        return inputs

    async def _stage_outputs(self, run: _Run, sid: int) -> AsyncIterator[StageOutput]:
        """Submit stage ``sid`` once its plain inputs are complete and yield what the caller may see of
        it: deltas with data (accumulated, and fed to streaming edges) and progress-only updates.
        Raises on the stage's errors; marks the stage finished at the end."""
        st = run.stages[sid]
        spec = st.spec
        rid = run.request.request_id
        streaming = [e for e in spec.inputs if self._streams(e)]
        for edge in spec.inputs:
            if edge not in streaming:
                await run.stages[edge.source].finished.wait()
        try:
            inputs = self._stage_inputs(run, spec)
        except InvalidRequestError as e:  # the edge found the request itself at fault
            raise e.within(f"stage {sid} ({spec.name}): ") from None
        except (ValueError, TypeError, KeyError) as e:
            raise StageFailedError(f"stage {sid} ({spec.name}): preparing its input failed: {e}") from e
        consumers = tuple(c for c, other in run.stages.items() if any(e.source == sid for e in other.spec.inputs))
        wanted = None
        if run.request.modalities is not None and not consumers:
            wanted = str(st.output_type & run.request.modalities)
        speech = inputs.pop("speech", None)  # crosses to the stage as its typed field
        req = StageRequest(
            rid,
            inputs,
            run.request.sampling_params[sid],
            stream_inputs=bool(streaming),
            consumers=consumers,
            wanted=wanted,
            final_only=not run.request.stream and not st.subscribers,
            session_id=run.request.session_id,
            speech=speech,
        )
        started = time.monotonic()
        st.submitted = True
        st.started.set()
        # aclosing: however this loop ends (error, abort, consumer gone), the engine's stream is closed now,
        # so the stage releases the request at once instead of whenever the generator is collected
        context = f"stage {sid} ({spec.name}): "
        async with contextlib.aclosing(self.clients[sid].generate(req)) as stream:
            async for out in stream:
                if out.error is not None:
                    raise out.error.exception(context)
                if out.finished and out.finish_reason == "abort":
                    raise StageFailedError(f"request {rid} was aborted in stage {sid}")
                if out.num_tokens is not None:
                    st.num_tokens = out.num_tokens
                if out.progress is not None:
                    st.progress = out.progress
                data = out.data
                if data:
                    data = normalize_keys(data, st.output_type.names()[0], spec.accumulation)
                    if "prompt_token_ids" in data:
                        st.num_prompt_tokens = len(data["prompt_token_ids"])
                    st.acc.add(data)
                    for q in st.subscribers:
                        q.put_nowait(data)
                    out.data = data
                    yield out
                elif out.progress is not None and not out.finished:
                    yield out
                if out.finished:
                    st.metrics = out.metrics or StageMetrics(run_time_s=time.monotonic() - started)
                    st.finish_reason = out.finish_reason
                    break
            else:
                raise StageFailedError(f"{context}ended request {rid} without finishing it")
        st.finished.set()
        for q in st.subscribers:
            q.put_nowait(_DONE)

    def _request_error(self, run: _Run, sid: int, e: Exception) -> Exception:
        """What the caller sees for an exception out of a stage (an in-process engine raises its own)."""
        if isinstance(e, StageFailedError) or (isinstance(e, InvalidRequestError) and e.context):
            return e
        error = StageError.of(e)
        if not error.bad_input:
            logger.error("stage %s failed request %s", sid, run.request.request_id, exc_info=e)
        return error.exception(f"stage {sid} ({self.pipeline.stage(sid).name}): ")

    async def _run_stage(self, run: _Run, sid: int) -> None:
        try:
            async for out in self._stage_outputs(run, sid):
                run.events.put_nowait((sid, out))
            run.events.put_nowait((sid, _DONE))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            run.events.put_nowait((sid, self._request_error(run, sid, e)))

    async def _pump(self, run: _Run, edge: Edge, sid: int, q: asyncio.Queue) -> None:
        """Streaming edge: turn upstream deltas into chunks fed to the downstream stage."""
        rid = run.request.request_id
        state: dict[str, Any] = {"finished": False}
        try:
            await run.stages[sid].started.wait()
            client = self.clients[sid]
            while True:
                item = await q.get()
                if item is _DONE:
                    state["finished"] = True
                    chunk = edge.process_chunk({}, run.request, state)
                    await client.feed(rid, chunk or {}, last=True)
                    return
                chunk = edge.process_chunk(item, run.request, state)
                if chunk:
                    await client.feed(rid, chunk, last=False)
        except asyncio.CancelledError:
            raise
        except InvalidRequestError as e:  # the edge found the request itself at fault (a 400, not a fault)
            run.events.put_nowait((sid, e.within(f"edge {edge.source}->{sid}: ")))
        except StageUnavailableError as e:  # the downstream stage died under the feed: retryable (503)
            run.events.put_nowait((sid, e))
        except Exception as e:
            logger.exception("edge %s->%s failed for %s", edge.source, sid, rid)
            run.events.put_nowait((sid, StageFailedError(f"edge {edge.source}->{sid} failed: {type(e).__name__}: {e}")))

    async def _cleanup(self, run: _Run) -> None:
        """Abort the request in every stage still holding it, then stop its tasks."""
        rid = run.request.request_id
        if self._runs.get(rid) is not run:
            return
        del self._runs[rid]
        for sid, st in run.stages.items():
            if st.submitted and not st.finished.is_set() and self.clients[sid].holds(rid):
                try:
                    await self.clients[sid].abort(rid)
                except Exception:  # a dead stage cannot abort; its requests already failed
                    logger.exception("abort of %s on stage %s failed", rid, sid)
        for task in run.tasks:
            task.cancel()
        await asyncio.gather(*run.tasks, return_exceptions=True)
