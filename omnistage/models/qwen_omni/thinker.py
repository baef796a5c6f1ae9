"""The thinker stage: the generic vLLM llm stage on the Qwen3-Omni folder (vLLM's own
``Qwen3OmniMoeThinkerForConditionalGeneration``: text, audio, images and video in), plus what the
talker needs of a media prompt.

- A plain text ``prompt`` (no ``multi_modal_data``) is a user message: Qwen3-Omni is a chat model, and the talker
  speaks the assistant turn of a chat (it finds it by ``<|im_start|>assistant``).
  System messages reach the thinker only (transformers' talker skips system turns).
- Sampling defaults are the checkpoint's ``generation_config.json`` (under the request's own values).
- dtype: the checkpoint's own unless the deploy names one. vLLM's CPU backend would run a float32 checkpoint
  in bfloat16 (its preferred CPU dtype), which is why an image prompt once agreed with transformers' float32
  ``generate`` for 2 tokens only: the thinker must compute what the reference computes.
- Outputs text and the reply's token ids (what the talker reads), and the rendered prompt's ids in the
  first output (the generic stage does that for every llm stage). When the talker runs, an output that is not the
  last says so (``reply_continues``): its tokens will be fed back to the thinker, so the talker may read them at
  once instead of waiting for the next token (transformers' talker never sees the thinker's last token).
- **Media for the talker** (speaking pipeline only, and only when the talker runs for this request): transformers'
  talker reads, at the prompt's media positions, the thinker's hidden state after layer ``accept_hidden_layer``,
  and gives the prompt M-RoPE positions from the media's grids. The thinker engine itself hands that state out:
  it runs ``vllm_speaking.py`` (vLLM's own thinker that also writes it into a cache-only layer) with the KV
  connector of ``stages/llm/hidden_connector.py``; a media request names a file in its ``SamplingParams``
  (``rendered``), the connector writes the prompt's rows there before the first token leaves the engine, and the
  first output carries ``talker_media``: those rows ``[media tokens, D]`` and the grids (``image_grid_thw``,
  ``video_grid_thw``, ``video_second_per_grid``, ``audio_feature_lengths``, ``use_audio_in_video``) read off the
  rendered input. No second engine, no second prefill. vLLM's multimodal processor cache is off on this stage
  (``checkpoint_deploy``), so repeated media are processed again, as transformers does for every call.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from omnistage.models.qwen_omni.config import load_omni_config
from omnistage.models.qwen_omni.vllm_plugin import SPEAKING_ARCHITECTURE
from omnistage.models.shared.omni.thinker import (
    OmniThinkerEngine,
    checkpoint_deploy,
    speaking_deploy,
)
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageOutput, StageRequest

logger = logging.getLogger(__name__)


class ThinkerEngine(OmniThinkerEngine):
    def __init__(self, ctx: StageContext, feeds_talker: bool = False):
        config = load_omni_config(ctx.model) if ctx.model else None
        super().__init__(ctx, config.sampling_defaults("thinker") if config else {}, feeds_talker and bool(config))
        self.media_ids = config.media_token_ids if config else frozenset()

    def rendered(self, req: StageRequest, engine_input: Any, params: Any) -> None:
        ids = engine_input["prompt_token_ids"]
        if self.rows_dir is None or not req.consumers or not any(t in self.media_ids for t in ids):
            return
        self.ask_rows(req, engine_input, params, reply=False)

    def _talker_media(self, request_id: str, ids: list[int]) -> dict[str, Any]:
        import torch

        grids = self.take_grids(request_id)
        rows = self.rows(request_id, len(ids))
        self.done_with_rows(request_id)
        mask = torch.isin(torch.as_tensor(ids), torch.tensor(sorted(self.media_ids)))
        return {"hidden": rows[mask].contiguous(), **grids}

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        rid = req.request_id
        try:
            async for out in super().generate(req):
                if self.asked_rows(rid):  # the first output: the connector wrote the prompt's rows before it
                    out.data["talker_media"] = self._talker_media(rid, out.data["prompt_token_ids"])
                if req.consumers and not out.finished and out.data.get("token_ids"):
                    out.data["reply_continues"] = True  # more tokens follow: these are fed back (module docstring)
                yield out
        finally:
            self.forget_rows(rid)


def build_thinker_engine(ctx: StageContext, feeds_talker: bool = False) -> ThinkerEngine:
    dtype = load_omni_config(ctx.model).dtype if ctx.model else None
    ctx = checkpoint_deploy(ctx, dtype, feeds_talker)
    if feeds_talker and ctx.model:
        ctx = speaking_deploy(ctx, SPEAKING_ARCHITECTURE)
    return ThinkerEngine(ctx, feeds_talker=feeds_talker)
