"""GLM-Image's AR stage: the generic vLLM stage with GLM-Image's prompt layout.

The prompt is built by the model's own ``GlmImageProcessor`` (chat template,
then the ``<sop>H W<eop>`` target grid(s) and the image start token) from the
request's target size (``edges.requested_size``), so the vLLM model reads the
grids from the prompt itself. The number of tokens to generate follows from
the size; a caller's ``max_tokens`` must agree with it.

Image-to-image: the source images (``multi_modal_data.image``) go through the
same processor and the model's vision encoder + VQ here (``source_images``);
vLLM gets their VQ ids as multimodal data (``vllm_processing``), and the first
output carries them (``prior_token_image_ids``, ``source_image_grid_thw``) for
the diffusion stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams
from omnistage.models.glm_image.edges import requested_size, source_images
from omnistage.models.glm_image.grid import generated_layout
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.llm.engine import LLMStageEngine, Prepared


def _ar_context(ctx: StageContext) -> StageContext:
    """vLLM loads the AR weights from vision_language_encoder/ and its tokenizer from processor/;
    source images arrive as precomputed multimodal inputs (VQ ids), which vLLM gates behind
    ``enable_mm_embeds``."""
    if ctx.model is None:
        return ctx
    args = {"tokenizer": str(Path(ctx.model) / "processor"), "enable_mm_embeds": True, **ctx.deploy.engine_args}
    return replace(ctx, deploy=ctx.deploy.model_copy(update={"engine_args": args}))


class GlmImageAREngine(LLMStageEngine):
    def __init__(self, ctx: StageContext):
        super().__init__(_ar_context(ctx))
        self.processor: Any = None
        self.source_tokenizer: Any = None

    async def start(self) -> None:
        import asyncio

        from transformers import GlmImageProcessor

        from omnistage.models.glm_image.source_images import SourceImageTokenizer

        await super().start()
        self.processor = GlmImageProcessor.from_pretrained(self.ctx.deploy.engine_args["tokenizer"])
        folder = Path(self.ctx.model) / self.ctx.spec.model_subfolder
        self.source_tokenizer = await asyncio.to_thread(SourceImageTokenizer.load, folder, torch.float32)

    def processor_inputs(self, prompt: str, height: int, width: int, images: list[Any]) -> Mapping[str, Any]:
        content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": prompt}]
        try:
            return self.processor.apply_chat_template(
                [[{"role": "user", "content": content}]],
                tokenize=True,
                target_h=height,
                target_w=width,
                return_dict=True,
                return_tensors="pt",
            )
        except ValueError as e:  # e.g. a source image too small or too elongated for the processor
            raise InvalidRequestError("multi_modal_data.image", f"{e}") from None

    def prepare(self, req: StageRequest) -> Prepared:
        inputs = req.inputs or {}
        prompt = inputs.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidRequestError("prompt", "GLM-Image needs a non-empty text prompt")
        given = req.params.given() if isinstance(req.params, LLMSamplingParams) else req.params
        if not isinstance(given, (Mapping, type(None))):
            raise InvalidRequestError(
                "sampling_params", "pass a dict for the GLM-Image AR stage (height/width ride along)"
            )
        params = dict(given or {})
        images = source_images(inputs)
        height, width = requested_size(inputs, params)
        params.pop("height", None)
        params.pop("width", None)
        _, needed = generated_layout(height, width, image_to_image=bool(images))
        if params.get("max_tokens") not in (None, needed):
            raise InvalidRequestError(
                "max_tokens", f"a {height}x{width} GLM-Image takes exactly {needed} AR tokens; leave it unset"
            )
        params["max_tokens"] = needed
        hf = self.processor_inputs(prompt, height, width, images)
        ids = hf["input_ids"][0].tolist()
        prep = super().prepare(replace(req, inputs={"prompt_token_ids": ids, "prompt": prompt}, params=params))
        if images:
            grids = hf["image_grid_thw"][: len(images)]  # the source grids; the target grid comes last
            vq = self.source_tokenizer.tokenize(hf["pixel_values"], grids)
            prep.mm_data = {"image": {"image_token_ids": vq, "image_grid_thw": grids}}
            prep.extra = {"prior_token_image_ids": vq.tolist(), "source_image_grid_thw": grids.tolist()}
        return prep
