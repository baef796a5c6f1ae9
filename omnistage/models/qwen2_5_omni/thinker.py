"""The thinker stage: the generic vLLM llm stage on the Qwen2.5-Omni folder (vLLM's own
``Qwen2_5OmniThinkerForConditionalGeneration``: text, audio, images and video in), plus what the talker needs.

Its vLLM engine runs that model with transformers' M-RoPE positions (``vllm_thinker.py``: vLLM 0.32 places a video
with its audio one token off), selected by ``hf_overrides`` architectures.

What it shares with Qwen3-Omni's thinker (``qwen_omni.thinker.OmniThinkerEngine``): a plain prompt is a user
message, the checkpoint's sampling defaults and dtype, no multimodal processor cache when the talker reads it, the
engine's own hidden states handed out through a file per request.
- **The talker's conditioning** (speaking pipeline, and only when the talker runs for this request):
  transformers' talker reads the thinker's last-layer (normed) hidden state of every prompt token and of every
  reply token fed back to the thinker (the reply without its last token). The thinker engine itself hands those
  out: it runs ``vllm_speaking.py`` (the same thinker, also writing its output into a cache-only layer) with the KV
  connector of ``stages/llm/hidden_connector.py``, which copies the request's rows into its file as each step
  computes them. Each output carries the rows computed since the last one (``talker_rows``: the first output the
  prompt's, then one per reply token fed back), so a streamed talker starts after the thinker's second token;
  the first output also carries the media grids transformers' talker positions the prompt with
  (``talker_media``). No second engine, no second prefill.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from omnistage.models.qwen2_5_omni.config import load_omni25_config
from omnistage.models.qwen2_5_omni.vllm_plugin import SPEAKING_ARCHITECTURE, THINKER_ARCHITECTURE
from omnistage.models.shared.omni.thinker import OmniThinkerEngine, checkpoint_deploy, speaking_deploy
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageOutput, StageRequest


class ThinkerEngine(OmniThinkerEngine):
    def __init__(self, ctx: StageContext, feeds_talker: bool = False):
        config = load_omni25_config(ctx.model) if ctx.model else None
        super().__init__(ctx, config.sampling_defaults("thinker") if config else {}, feeds_talker and bool(config))

    def rendered(self, req: StageRequest, engine_input: Any, params: Any) -> None:
        if self.rows_dir is not None and req.consumers:
            self.ask_rows(req, engine_input, params, reply=True)

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        rid = req.request_id
        prompt, reply, sent = 0, 0, 0
        try:
            async for out in super().generate(req):
                prompt = len(out.data.get("prompt_token_ids") or ()) or prompt  # (the first output has them)
                reply += len(out.data.get("token_ids") or ())
                if self.asked_rows(rid) and out.finish_reason != "abort":
                    grids = self.take_grids(rid)  # (with the first output)
                    if grids is not None:
                        out.data["talker_media"] = grids
                    computed = prompt + reply - 1  # the prompt and the reply fed back so far
                    if computed > sent:
                        out.data["talker_rows"] = self.rows(rid, computed, sent)
                        sent = computed
                    if out.finished:
                        self.done_with_rows(rid)
                yield out
        finally:
            self.forget_rows(rid)


def with_thinker_architecture(ctx: StageContext) -> StageContext:
    """The deploy running ``vllm_thinker.py``'s thinker (transformers' positions) unless it names its own
    ``hf_overrides``."""
    deploy = ctx.deploy
    if "hf_overrides" in deploy.engine_args:
        return ctx
    overrides = {"hf_overrides": {"architectures": [THINKER_ARCHITECTURE]}}
    return replace(ctx, deploy=deploy.model_copy(update={"engine_args": {**deploy.engine_args, **overrides}}))


def build_thinker_engine(ctx: StageContext, feeds_talker: bool = False) -> ThinkerEngine:
    dtype = load_omni25_config(ctx.model).dtype if ctx.model else None
    ctx = checkpoint_deploy(ctx, dtype, feeds_talker)
    ctx = speaking_deploy(ctx, SPEAKING_ARCHITECTURE) if feeds_talker and ctx.model else with_thinker_architecture(ctx)
    return ThinkerEngine(ctx, feeds_talker=feeds_talker)
