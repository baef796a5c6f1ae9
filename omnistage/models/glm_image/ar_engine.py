"""GLM-Image's AR stage: the generic vLLM stage with GLM-Image's prompt layout.

The prompt is built by the model's own ``GlmImageProcessor`` (chat template,
then the ``<sop>H W<eop>`` target grids and the image start token) from the
request's target size (``edges.requested_size``), so the vLLM model reads the
grids from the prompt itself. The number of tokens to generate follows from
the size; a caller's ``max_tokens`` must agree with it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from omnistage.models.glm_image.edges import requested_size
from omnistage.models.glm_image.grid import generated_layout
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.llm.engine import LLMStageEngine


def _with_tokenizer(ctx: StageContext) -> StageContext:
    """vLLM loads the AR weights from vision_language_encoder/ and its tokenizer from processor/."""
    if ctx.model is None or "tokenizer" in ctx.deploy.engine_args:
        return ctx
    args = {"tokenizer": str(Path(ctx.model) / "processor"), **ctx.deploy.engine_args}
    return replace(ctx, deploy=ctx.deploy.model_copy(update={"engine_args": args}))


class GlmImageAREngine(LLMStageEngine):
    def __init__(self, ctx: StageContext):
        super().__init__(_with_tokenizer(ctx))
        self.processor: Any = None

    async def start(self) -> None:
        from transformers import GlmImageProcessor

        await super().start()
        self.processor = GlmImageProcessor.from_pretrained(self.ctx.deploy.engine_args["tokenizer"])

    def prompt_ids(self, prompt: str, height: int, width: int) -> list[int]:
        msgs = [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]]
        out = self.processor.apply_chat_template(msgs, tokenize=True, target_h=height, target_w=width,
                                                 return_dict=True)
        return list(out["input_ids"][0])

    def prepare(self, req: StageRequest):
        inputs = req.inputs or {}
        if (inputs.get("multi_modal_data") or {}).get("image") is not None:
            raise ValueError("multi_modal_data.image: image-to-image is not supported by the GLM-Image AR stage yet")
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt: GLM-Image needs a non-empty text prompt")
        params = dict(req.params) if isinstance(req.params, Mapping) else {}
        if not isinstance(req.params, (Mapping, type(None))):
            raise ValueError("sampling_params: pass a dict for the GLM-Image AR stage (height/width ride along)")
        height, width = requested_size(inputs, params)
        params.pop("height", None)
        params.pop("width", None)
        _, needed = generated_layout(height, width, image_to_image=False)
        if params.get("max_tokens") not in (None, needed):
            raise ValueError(f"max_tokens: a {height}x{width} GLM-Image takes exactly {needed} AR tokens; leave it unset")
        params["max_tokens"] = needed
        ids = self.prompt_ids(prompt, height, width)
        return super().prepare(replace(req, inputs={"prompt_token_ids": ids, "prompt": prompt}, params=params))
