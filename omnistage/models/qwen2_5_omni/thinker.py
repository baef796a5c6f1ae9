"""The thinker stage: the generic vLLM llm stage on the Qwen2.5-Omni folder (vLLM's own
``Qwen2_5OmniThinkerForConditionalGeneration``: text, audio, images and video in), plus what the talker needs.

Both of its vLLM engines run that model with transformers' M-RoPE positions (``vllm_thinker.py``: vLLM 0.32
places a video with its audio one token off), selected by ``hf_overrides`` architectures.

What it shares with Qwen3-Omni's thinker (``qwen_omni.thinker.OmniThinkerEngine``): a plain prompt is a user
message, the checkpoint's sampling defaults and dtype, no multimodal processor cache when the talker reads it.
- **The talker's conditioning** (speaking pipeline, and only when the talker runs for this request):
  transformers' talker reads the thinker's last-layer (normed) hidden state of every prompt token and of every
  reply token fed back to the thinker (the reply without its last token). vLLM returns no hidden states from a
  generating engine, so once the reply is complete the stage sends the rendered engine input with the reply's
  ids appended (the same processed media) to a second vLLM engine in pooling mode (``stages/llm/hidden.py``:
  ``token_embed``, no activation — vLLM's own thinker, whose pooled output is that normed hidden state) and adds
  ``talker_thinker`` to the last output: ``hidden`` [prompt + reply - 1, D] and the media grids transformers'
  talker positions the prompt with. Cost per spoken request: one extra prefill of prompt + reply (encoders
  included) before the talker starts. vLLM's multimodal processor cache is off on this stage (a cached item is
  left out of the rendered input, and the pooling engine has its own core).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from omnistage.models.qwen2_5_omni.config import load_omni25_config
from omnistage.models.qwen2_5_omni.vllm_plugin import THINKER_ARCHITECTURE
from omnistage.models.qwen_omni.thinker import OmniThinkerEngine, checkpoint_deploy, media_grids
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageOutput, StageRequest


class ThinkerEngine(OmniThinkerEngine):
    def __init__(self, ctx: StageContext, feeds_talker: bool = False):
        config = load_omni25_config(ctx.model) if ctx.model else None
        # the same thinker, pooled: its output is the final normed hidden state the talker reads
        super().__init__(ctx, config.sampling_defaults("thinker") if config else {},
                         {"architectures": [THINKER_ARCHITECTURE]} if feeds_talker and config else None)
        self._inputs: dict[str, Any] = {}  # request id -> its rendered engine input (requests the talker reads)

    def rendered(self, req: StageRequest, engine_input: Any, params: Any) -> None:
        if self.hidden is not None and req.consumers:
            self._inputs[req.request_id] = engine_input

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        rid = req.request_id
        reply: list[int] = []
        try:
            async for out in super().generate(req):
                reply.extend(out.data.get("token_ids") or [])
                engine_input = self._inputs.get(rid)
                if out.finished and engine_input is not None and out.finish_reason != "abort" and reply:
                    out.data["talker_thinker"] = await self.talker_conditioning(rid, engine_input, reply)
                yield out
        finally:
            self._inputs.pop(rid, None)

    async def talker_conditioning(self, rid: str, engine_input: Any, reply: list[int]) -> dict[str, Any]:
        """The thinker's hidden states of the prompt and of the reply fed back (all but its last token)."""
        ids = list(engine_input["prompt_token_ids"])
        extended = {**engine_input, "prompt_token_ids": ids + reply[:-1]}
        hidden = await self.hidden_states(extended, rid)
        return {"hidden": hidden.float().contiguous(), **media_grids(engine_input)}


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
    ctx = with_thinker_architecture(checkpoint_deploy(ctx, dtype, feeds_talker))
    return ThinkerEngine(ctx, feeds_talker=feeds_talker)
