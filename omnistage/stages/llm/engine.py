"""LLMStageEngine: one vLLM ``AsyncLLM`` per llm stage replica.

The engine tokenizes the stage's input itself (prompt text, token ids, or
chat messages through the model's chat template), validates the request
before vLLM sees it, and streams DELTA ``StageOutput``s carrying ``text``
and/or ``token_ids`` per the stage's ``engine_output_type``. The first output
also carries ``prompt_token_ids`` (the server reports them in ``usage``); the
last one has ``finish_reason`` and the stage metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from omnistage.modality import OutputModality
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageMetrics, StageOutput, StageRequest, StageStats, peak_memory_mb
from omnistage.stages.llm.inputs import prompt_token_ids
from omnistage.stages.llm.params import to_sampling_params
from omnistage.stages.llm.threads import engine_closed, engine_env

logger = logging.getLogger(__name__)

PRODUCIBLE = OutputModality.TEXT | OutputModality.TOKEN_IDS
DEFAULT_CPU_KV_CACHE_BYTES = 64 << 20  # without it the CPU backend reserves a share of all RAM


def engine_args_for(ctx: StageContext) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments from the stage's deploy config."""
    from vllm.platforms import current_platform

    d = ctx.deploy
    model = Path(ctx.model) if ctx.model else None
    if model is None:
        raise ValueError(f"stage {ctx.spec.stage_id}: an llm stage needs a model folder")
    if ctx.spec.model_subfolder:
        model = model / ctx.spec.model_subfolder
    args: dict[str, Any] = {"model": str(model), "disable_log_stats": True, "tensor_parallel_size": d.tp_size}
    if current_platform.is_cpu():
        args["enforce_eager"] = True  # compiling costs ~30 s at start-up on CPU and gains little
    optional = {
        "max_num_seqs": d.max_num_seqs, "max_model_len": d.max_model_len,
        "max_num_batched_tokens": d.max_num_batched_tokens, "enforce_eager": d.enforce_eager,
        "kv_cache_memory_bytes": d.kv_cache_memory_bytes, "gpu_memory_utilization": d.gpu_memory_utilization,
        "enable_prefix_caching": d.enable_prefix_caching, "trust_remote_code": d.trust_remote_code,
        "dtype": d.dtype, "seed": d.seed,
    }
    args.update({k: v for k, v in optional.items() if v is not None})
    if current_platform.is_cpu() and d.kv_cache_memory_bytes is None and d.gpu_memory_utilization is None:
        args["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
    args.update(d.engine_args)  # explicit pass-through wins
    return args


def stage_output_type(ctx: StageContext) -> OutputModality:
    out = OutputModality.parse(ctx.deploy.engine_output_type or ctx.spec.output)
    if out & ~PRODUCIBLE:
        raise ValueError(f"stage {ctx.spec.stage_id}: engine_output_type {out} is not something an llm stage "
                         f"produces (it produces {PRODUCIBLE})")
    return out


@dataclass
class Prepared:
    """A validated request, ready for vLLM."""

    ids: list[int]
    text: str | None
    params: Any  # vllm SamplingParams
    mm_data: dict[str, Any] | None = None  # vLLM multi_modal_data (a family's own multimodal inputs)
    extra: dict[str, Any] = field(default_factory=dict)  # added to the first output (e.g. source-image ids)

    async def engine_input(self, engine: Any) -> Any:
        from vllm.inputs import TokensPrompt
        from vllm.inputs.engine import tokens_input

        if self.mm_data is None:
            return tokens_input(self.ids, prompt=self.text)
        prompt = TokensPrompt(prompt_token_ids=self.ids, multi_modal_data=self.mm_data)
        if self.text is not None:
            prompt["prompt"] = self.text
        # vLLM's renderer runs the model's registered multimodal processor on it
        return (await engine.renderer.render_cmpl_async([prompt]))[0]


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

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_args_for(self.ctx)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as e:
            raise ValueError(f"stages[{self.stage_id}].engine_args: {e}") from None

        def build() -> Any:
            with engine_env(self.ctx.devices, self.ctx.deploy.num_threads, self.ctx.deploy.tp_size,
                            current_platform.is_cpu()) as env:
                if env:
                    logger.info("stage %d: vLLM thread settings %s", self.stage_id, env)
                return AsyncLLM.from_engine_args(args)

        # Construction blocks for seconds (engine-core process start-up): keep the loop free.
        self.engine = await asyncio.to_thread(build)
        self.tokenizer = self.engine.get_tokenizer()
        self.max_model_len = self.engine.model_config.max_model_len
        self.vocab_size = self.engine.model_config.get_vocab_size()

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is None:
            return
        for rid in list(self._active):
            await self._abort_in_vllm(engine, rid)
        await asyncio.to_thread(engine.shutdown)
        engine_closed()

    def stats(self) -> StageStats:
        if self.engine is None:
            return StageStats(healthy=False, detail="not started")
        cap = self.engine.vllm_config.scheduler_config.max_num_seqs
        n = len(self._active)
        return StageStats(queue_depth=max(0, n - cap), running=min(n, cap), healthy=not self.engine.errored)

    # ------------------------------------------------------------------ requests

    def prepare(self, req: StageRequest) -> Prepared:
        """Validate and tokenize; every problem is a ValueError naming the field."""
        if req.stream_inputs:
            raise ValueError(f"stage {self.stage_id}: llm stages do not accept streamed (async chunk) input")
        ids, text = prompt_token_ids(req.inputs, self.tokenizer)
        if not ids:
            raise ValueError("prompt: empty prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt: {len(ids)} tokens do not fit max_model_len={self.max_model_len} "
                             "(at least one token must be generated)")
        sp = to_sampling_params(req.params, vocab_size=self.vocab_size)
        if sp.max_tokens is not None and len(ids) + sp.max_tokens > self.max_model_len:
            # vLLM would stop at max_model_len silently; say so instead.
            raise ValueError(f"max_tokens: prompt ({len(ids)} tokens) + max_tokens ({sp.max_tokens}) exceeds "
                             f"max_model_len={self.max_model_len}")
        return Prepared(ids, text, sp)

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        from vllm.exceptions import VLLMClientError

        if self.engine is None:
            raise RuntimeError(f"stage {self.stage_id}: engine not started")
        rid = req.request_id
        if rid in self._active:
            raise ValueError(f"request_id {rid!r} is already running on stage {self.stage_id}")
        prep = self.prepare(req)
        ids, sp = prep.ids, prep.params
        want_text = OutputModality.TEXT in self.output_type and sp.detokenize
        want_ids = OutputModality.TOKEN_IDS in self.output_type
        self._active.add(rid)
        first_at: float | None = None
        num_tokens = 0
        done = False
        final: StageOutput | None = None
        try:
            engine_input = await prep.engine_input(self.engine)
            async for ro in self.engine.generate(engine_input, sp, request_id=rid):
                comp = ro.outputs[0]
                now = time.monotonic()
                data: dict[str, Any] = {}
                if first_at is None:
                    first_at = now
                    data["prompt_token_ids"] = list(ids)
                    data.update(prep.extra)
                num_tokens += len(comp.token_ids)
                if want_text and comp.text:
                    data["text"] = comp.text
                if want_ids and comp.token_ids:
                    data["token_ids"] = list(comp.token_ids)
                if data:
                    data["num_tokens"] = num_tokens  # running count: lets the server report continuous usage
                if ro.finished:
                    data["finish_reason"] = "abort" if rid in self._aborted else comp.finish_reason
                    metrics = StageMetrics(
                        # Without vLLM's stats logging the scheduling time is not exposed:
                        # the queue time here runs up to the first output.
                        queue_time_s=first_at - req.arrival_time, run_time_s=now - first_at,
                        num_tokens=num_tokens, peak_memory_mb=peak_memory_mb(),
                    )
                    final = StageOutput(rid, self.stage_id, data, finished=True, metrics=metrics)
                    # Not yielded inside the loop: vLLM's stream must run to its end, or closing it
                    # later (when our consumer stops reading) sends vLLM a needless abort.
                    continue
                if data:
                    yield StageOutput(rid, self.stage_id, data, finished=False)
            done = True
            # vLLM ends an aborted request's stream without a final output in some paths.
            yield final or StageOutput(rid, self.stage_id, {"finish_reason": "abort"}, finished=True,
                                       metrics=StageMetrics(num_tokens=num_tokens, peak_memory_mb=peak_memory_mb()))
        except VLLMClientError as e:  # vLLM rejected the request: the caller's fault, not the stage's
            raise ValueError(str(e)) from None
        finally:
            self._active.discard(rid)
            self._aborted.discard(rid)
            if not done and self.engine is not None:
                # Closed early by the consumer: free vLLM's slot now rather than when the
                # inner generator is garbage-collected (a task, since this may run during cancellation).
                task = asyncio.get_running_loop().create_task(self._abort_in_vllm(self.engine, rid))
                self._bg.add(task)  # keep a reference until it ran
                task.add_done_callback(self._bg.discard)

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        raise ValueError(f"stage {self.stage_id}: llm stages do not accept streamed (async chunk) input")

    async def abort(self, request_id: str) -> None:
        if self.engine is not None and request_id in self._active:
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
