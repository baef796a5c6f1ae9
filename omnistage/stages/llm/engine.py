"""LLMStageEngine: one vLLM ``AsyncLLM`` per llm stage replica.

The stage's input (prompt text, token ids, or chat messages, with images /
audio / video) becomes an engine input through vLLM's own renderer (the
model's chat template and multimodal processor: inputs.py); the request is
validated before vLLM runs it, and the engine streams DELTA ``StageOutput``s
carrying ``text`` and/or ``token_ids`` per the stage's ``engine_output_type``.
The first output also carries ``prompt_token_ids`` as vLLM counts them
(multimodal placeholders included; the server reports them in ``usage``); every
output carries the running ``num_tokens``, the last one ``finish_reason`` and the stage metrics. A request
with ``logprobs`` set gets ``logprobs`` too: per new token, the log-probability vLLM gives the sampled one
(its ``logprobs_mode``, raw by default: before any logits processor), e.g. for verbose_json's ``avg_logprob``.

vLLM's engine core runs in its own process. When it dies (killed, out of
memory, a crash) the engine notices (``errored`` / ``EngineDeadError``), fails
its in-flight requests with ``StageUnavailableError`` (HTTP 503), reports
itself unhealthy and builds a new ``AsyncLLM`` under the shared restart policy
(stages/restart.py); requests arriving meanwhile get the same 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from omnistage.errors import InvalidRequestError, StageUnavailableError
from omnistage.modality import OutputModality
from omnistage.pipeline import StageContext
from omnistage.stages.base import (
    StageMetrics,
    StageOutput,
    StageRequest,
    StageStats,
    peak_memory_mb,
)
from omnistage.stages.lifetime import children_die_with_this_process, start_in_spawner
from omnistage.stages.llm.args import engine_args_for, stage_output_type
from omnistage.stages.llm.inputs import (
    StagePrompt,
    check_media,
    decoder_token_ids,
    parse,
    prompt_media_tokens,
    render,
)
from omnistage.stages.llm.loras import VllmLoras
from omnistage.stages.llm.params import llm_params, to_sampling_params
from omnistage.stages.llm.threads import engine_closed, engine_env
from omnistage.stages.restart import RESTART_ATTEMPTS, restart_with_backoff

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 0.5  # how often an idle engine is checked for a dead engine core


def _shut_down_when_built(building: Any) -> None:
    """Shut down an engine whose construction outlived the stage (runs on the spawner thread)."""
    if not building.cancelled() and building.exception() is None:
        building.result().shutdown()
        engine_closed()


@dataclass
class Prepared:
    """A validated request, ready for vLLM's renderer."""

    ids: list[int] | None  # the prompt's token ids when given as ids (else known once rendered)
    text: str | None
    params: Any  # vllm SamplingParams
    mm_data: dict[str, Any] | None = None  # vLLM multi_modal_data (a family's own multimodal inputs)
    extra: dict[str, Any] = field(default_factory=dict)  # added to the first output (e.g. source-image ids)
    source: StagePrompt | None = None  # the parsed input (text, messages, media) the renderer turns into ids
    lora: Any = None  # vllm LoRARequest of the adapter the request names

    async def engine_input(self, engine: Any) -> Any:
        source = self.source or StagePrompt("prompt", token_ids=self.ids, text=self.text)
        if self.mm_data is not None:
            source = replace(source, multi_modal_data=self.mm_data)
        # vLLM's renderer: the chat template, media loading and the model's multimodal processor
        return await render(engine, source)


class LLMStageEngine:
    def __init__(self, ctx: StageContext):
        self.ctx = ctx
        self.stage_id = ctx.spec.stage_id
        self.output_type = stage_output_type(ctx)  # a start-up error, before any engine is built
        self.engine: Any = None  # vllm AsyncLLM
        self.tokenizer: Any = None
        self.max_model_len = 0
        self.vocab_size = 0
        self._active: set[str] = set()
        self._aborted: set[str] = set()
        self._bg: set[asyncio.Task] = set()
        self.restarts = 0  # engines rebuilt after the engine core died
        self._dead: str | None = None  # why the engine is down (while it is rebuilt, or for good)
        self._watcher: asyncio.Task | None = None
        self._restarter: asyncio.Task | None = None
        self._closing = False
        self.loras = VllmLoras(self.stage_id, ctx.deploy.lora_enabled)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self._build()
        for i, m in enumerate(self.ctx.deploy.lora_modules):
            try:
                await self.load_lora(m.name, m.path)
            except InvalidRequestError as e:  # (the builder shuts a half-started engine down)
                where = f"stages[{self.stage_id}].lora_modules[{i}] ({m.name}={m.path})"
                raise ValueError(f"{where}: {e.message}") from None
        self._watcher = asyncio.create_task(self._watch(), name=f"stage{self.stage_id}-vllm-watch")

    async def _build(self) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine
        from vllm.platforms import current_platform

        kwargs = engine_args_for(self.ctx)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as e:
            raise InvalidRequestError(f"stages[{self.stage_id}].engine_args", f"{e}") from None

        def build() -> Any:
            with (
                engine_env(
                    self.ctx.devices, self.ctx.deploy.num_threads, self.ctx.deploy.tp_size, current_platform.is_cpu()
                ) as env,
                children_die_with_this_process(),  # the engine core and its workers (through vllm_plugin.py)
            ):
                if env:
                    logger.info("stage %d: vLLM thread settings %s", self.stage_id, env)
                return AsyncLLMEngine.from_engine_args(args)  # vLLM's public name for its AsyncLLM

        # Construction blocks for seconds (engine-core process start-up): keep the loop free. It runs on a
        # spawner thread, which outlives the engine core it starts (the kernel ties the child to that thread).
        building = start_in_spawner(build)
        try:
            self.engine = await asyncio.wrap_future(building)
        except asyncio.CancelledError:  # shutdown while a (re)build runs: the engine it builds must not outlive us
            building.add_done_callback(_shut_down_when_built)
            raise
        self.tokenizer = self.engine.get_tokenizer()
        self.max_model_len = self.engine.model_config.max_model_len
        self.vocab_size = self.engine.model_config.get_vocab_size()

    async def shutdown(self) -> None:
        self._closing = True  # engine errors from here on are the shutdown, not a death to recover from
        for task in (self._watcher, self._restarter):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._watcher = self._restarter = None
        await self._abort_active()
        await self._close_engine()

    async def _abort_active(self) -> None:
        """End the running requests on a live generating engine (before it is shut down)."""
        if self.engine is not None and not self.engine.errored:
            for rid in list(self._active):
                await self._abort_in_vllm(self.engine, rid)

    async def _close_engine(self) -> None:
        """Shut down the stage's vLLM engine."""
        engine, self.engine = self.engine, None
        if engine is not None:
            # AsyncLLM.shutdown stops the engine core before it cancels its output handler, which can read the
            # core's exit first and log it as a death (ERROR "output_handler failed", EngineDeadError) on a clean
            # exit: end the handler first, on the loop that runs it
            handler = getattr(engine, "output_handler", None)
            if isinstance(handler, asyncio.Task) and handler.get_loop() is asyncio.get_running_loop():
                handler.cancel()
                await asyncio.gather(handler, return_exceptions=True)
            await asyncio.to_thread(engine.shutdown)  # (a dead one: frees what its client still holds)
            engine_closed()

    def errored(self) -> str | None:
        """Why the stage's engine is dead (its engine core exited), or None."""
        return "the engine core process exited" if self.engine is not None and self.engine.errored else None

    def stats(self) -> StageStats:
        if self._dead is not None:
            return StageStats(running=len(self._active), healthy=False, detail=self._dead)
        if self.engine is None:
            return StageStats(healthy=False, detail="not started")
        cap = self.engine.vllm_config.scheduler_config.max_num_seqs
        n = len(self._active)
        errored = self.errored()  # (the watcher starts the restart within WATCH_INTERVAL_S)
        return StageStats(
            queue_depth=max(0, n - cap),
            running=min(n, cap),
            healthy=errored is None,
            detail=f"stage {self.stage_id} vLLM engine died ({errored})" if errored else "",
        )

    # ------------------------------------------------------------------ engine death and restart

    async def _watch(self) -> None:
        """Notice a dead engine core even when no request is running (so /health says so at once)."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            reason = self.errored() if self._dead is None else None
            if reason is not None:
                self._engine_died(reason)

    def _engine_died(self, reason: str) -> StageUnavailableError:
        """Mark the stage down and start rebuilding it (once, however many requests saw the death)."""
        if self._closing:
            return StageUnavailableError(f"stage {self.stage_id} is shutting down")
        if self._dead is None:
            self._dead = f"stage {self.stage_id} vLLM engine died ({reason}); restarting"
            logger.error("%s", self._dead)
            self._restarter = asyncio.get_running_loop().create_task(
                self._restart(), name=f"stage{self.stage_id}-vllm-restart"
            )
        return StageUnavailableError(self._dead)

    async def _restart(self) -> None:
        async def rebuild() -> None:
            await self._close_engine()
            self.restarts += 1
            await self._build()

        if await restart_with_backoff(f"stage {self.stage_id} vLLM engine", rebuild):
            self._dead = None
        else:
            self._dead = f"{self._dead.removesuffix('; restarting')}; {RESTART_ATTEMPTS} restarts failed"

    # ------------------------------------------------------------------ LoRA adapters

    def lora_names(self) -> list[str]:
        return self.loras.names()

    async def load_lora(self, name: str, path: str) -> None:
        await self.loras.load(self.engine, name, path)

    async def unload_lora(self, name: str) -> None:
        self.loras.unload(name)

    # ------------------------------------------------------------------ requests

    def prepare(self, req: StageRequest) -> Prepared:
        """Validate what can be checked before rendering (the length is checked on the rendered
        prompt); every problem is an InvalidRequestError naming the field."""
        if req.stream_inputs:
            raise ValueError(f"stage {self.stage_id}: llm stages do not accept streamed (async chunk) input")
        source = parse(req.inputs)
        ids = source.token_ids
        if ids is not None:
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidRequestError(
                    "prompt_token_ids", f"{bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
                )
        check_media(source, self.engine)
        params = llm_params(req.params)
        lora = self.loras.request(params)
        sp = to_sampling_params(params, vocab_size=self.vocab_size, final_only=req.final_only)
        return Prepared(ids, source.text, sp, source=source, lora=lora)

    def check_length(self, ids: list[int], sp: Any, field: str) -> None:
        """The (rendered) prompt must leave room for one token within max_model_len; a ``max_tokens`` past the
        context is cut to the room left, as vllm serve does (clients written for a bigger deploy still run)."""
        if not ids:
            raise InvalidRequestError(field, "empty prompt")
        if len(ids) >= self.max_model_len:
            raise InvalidRequestError(
                field,
                f"{len(ids)} tokens do not fit max_model_len={self.max_model_len} "
                "(at least one token must be generated)",
            )
        if sp.max_tokens is not None and len(ids) + sp.max_tokens > self.max_model_len:
            sp.max_tokens = self.max_model_len - len(ids)  # finish_reason "length" says where it stopped

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        if self._dead is not None:
            raise StageUnavailableError(self._dead)
        if self.engine is None:
            raise RuntimeError(f"stage {self.stage_id}: engine not started")
        engine = self.engine  # the one this request runs on (a restart replaces self.engine)
        rid = req.request_id
        if rid in self._active:
            raise ValueError(f"request_id {rid!r} is already running on stage {self.stage_id}")
        prep = self.prepare(req)
        sp = prep.params
        engine_input = await prep.engine_input(engine)
        # as vLLM counts them: multimodal placeholders included (an encoder-decoder model: the decoder's)
        ids = decoder_token_ids(engine_input)
        media = prompt_media_tokens(engine_input)  # usage: the prompt's tokens per modality
        self.check_length(ids, sp, prep.source.field if prep.source else "prompt")
        self.rendered(req, engine_input, sp)
        want_text = OutputModality.TEXT in self.output_type and sp.detokenize
        want_ids = OutputModality.TOKEN_IDS in self.output_type
        self._active.add(rid)
        first_at: float | None = None
        num_tokens = 0
        done = False
        final: StageOutput | None = None
        try:
            async for ro in engine.generate(engine_input, sp, request_id=rid, lora_request=prep.lora):
                comp = ro.outputs[0]
                now = time.monotonic()
                data = _delta(comp, want_text, want_ids, sp.logprobs is not None)
                if first_at is None:
                    first_at = now
                    data = {"prompt_token_ids": list(ids), **prep.extra, **data}
                num_tokens += len(comp.token_ids)
                if ro.finished:
                    # Without vLLM's stats logging the scheduling time is not exposed: the queue time here runs up
                    # to the first output (final-only: that is the last one, so the run time holds it all)
                    started = req.arrival_time if req.final_only else first_at
                    metrics = StageMetrics(
                        queue_time_s=started - req.arrival_time,
                        run_time_s=now - started,
                        num_tokens=num_tokens,
                        num_cached_tokens=int(ro.num_cached_tokens or 0),
                        num_prompt_audio_tokens=media.get("audio", 0),
                        num_prompt_image_tokens=media.get("image", 0),
                        num_prompt_video_tokens=media.get("video", 0),
                        peak_memory_mb=peak_memory_mb(),
                    )
                    reason = "abort" if rid in self._aborted else comp.finish_reason
                    final = StageOutput(
                        rid,
                        self.stage_id,
                        data,
                        finished=True,
                        metrics=metrics,
                        finish_reason=reason,
                        num_tokens=num_tokens,
                    )
                    # Not yielded inside the loop: vLLM's stream must run to its end, or closing it
                    # later (when our consumer stops reading) sends vLLM a needless abort.
                    continue
                if data:
                    # the running count lets the server report continuous usage without counting chunks
                    yield StageOutput(rid, self.stage_id, data, finished=False, num_tokens=num_tokens)
            done = True
            restarted = final is None or final.finish_reason == "abort"
            if self._dead is not None and rid not in self._aborted and restarted:
                raise StageUnavailableError(self._dead)  # aborted by the restart (_restart), not by its client
            # vLLM ends an aborted request's stream without a final output in some paths.
            yield final or StageOutput(
                rid,
                self.stage_id,
                {},
                finished=True,
                finish_reason="abort",
                num_tokens=num_tokens,
                metrics=StageMetrics(num_tokens=num_tokens, peak_memory_mb=peak_memory_mb()),
            )
        except VLLMClientError as e:  # vLLM rejected the request: the caller's fault, not the stage's
            raise ValueError(str(e)) from None
        except EngineDeadError:
            raise self._engine_died("EngineDeadError") from None
        except Exception:
            if engine.errored:  # whatever vLLM raised, the cause is the dead engine core
                raise self._engine_died("the engine core process exited") from None
            raise
        finally:
            self._release(engine, rid, done)

    def _release(self, engine: Any, rid: str, done: bool) -> None:
        self._active.discard(rid)
        self._aborted.discard(rid)
        if not done and not engine.errored:
            # Closed early by the consumer: free vLLM's slot now rather than when the
            # inner generator is garbage-collected (a task, since this may run during cancellation).
            task = asyncio.get_running_loop().create_task(self._abort_in_vllm(engine, rid))
            self._bg.add(task)  # keep a reference until it ran
            task.add_done_callback(self._bg.discard)

    def rendered(self, req: StageRequest, engine_input: Any, params: Any) -> None:
        """Called with the request's validated engine input and its ``SamplingParams`` before vLLM runs it (a
        family hook: it may add ``extra_args``)."""

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        raise ValueError(f"stage {self.stage_id}: llm stages do not accept streamed (async chunk) input")

    async def abort(self, request_id: str) -> None:
        if self.engine is not None and self._dead is None and request_id in self._active:
            self._aborted.add(request_id)
            await self._abort_in_vllm(self.engine, request_id)

    async def _abort_in_vllm(self, engine: Any, request_id: str) -> None:
        try:
            await engine.abort(request_id)
        except Exception:  # a dead engine has nothing left to free
            logger.exception("stage %d: vLLM abort of %s failed", self.stage_id, request_id)

    @property
    def num_unfinished_in_vllm(self) -> int:
        """Requests vLLM still tracks (0 once aborted/finished ones are freed)."""
        return self.engine.get_num_unfinished_requests() if self.engine is not None else 0


def _delta(comp: Any, want_text: bool, want_ids: bool, want_logprobs: bool) -> dict[str, Any]:
    """What one vLLM completion update adds: its text, its token ids, their logprobs (each when asked for)."""
    data: dict[str, Any] = {}
    if want_text and comp.text:
        data["text"] = comp.text
    if want_ids and comp.token_ids:
        data["token_ids"] = list(comp.token_ids)
    if want_logprobs and comp.logprobs:
        data["logprobs"] = [float(lp[t].logprob) for t, lp in zip(comp.token_ids, comp.logprobs)]
    return data
