"""The thinker stage: the generic vLLM llm stage on the Qwen3-Omni folder.

- vLLM serves the folder with its own ``Qwen3OmniMoeThinkerForConditionalGeneration``
  (text, image, audio and video in) when that model can be imported. vLLM 0.32's
  module imports torchvision (through transformers' Qwen2-VL image processor); without
  it the stage serves the thinker's language model through ``vllm_thinker.py``
  (text prompts; media parts are refused with a 400 naming the part). A deploy's own
  ``engine_args.hf_overrides`` wins over both.
- A plain text ``prompt`` (no ``multi_modal_data``) is a user message: Qwen3-Omni is a chat model, and the talker
  speaks the assistant turn of a chat (it finds it by ``<|im_start|>assistant``).
  System messages reach the thinker only (transformers' talker skips system turns).
- Sampling defaults are the checkpoint's ``generation_config.json`` (under the request's own values).
- Outputs text and the reply's token ids (what the talker reads), and the rendered
  prompt's ids in the first output (the generic stage does that for every llm stage).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache

from omnistage.models.qwen_omni.config import load_omni_config
from omnistage.models.qwen_omni.vllm_plugin import ARCHITECTURE
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.llm.engine import LLMStageEngine, Prepared

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def vllm_thinker_importable() -> str | None:
    """None when vLLM's own Qwen3-Omni thinker imports; else why not."""
    try:
        import vllm.model_executor.models.qwen3_omni_moe_thinker  # noqa: F401
    except Exception as e:  # noqa: BLE001 (ImportError without torchvision; RuntimeError from one built for another torch)
        return f"{type(e).__name__}: {e}"
    return None


def thinker_context(ctx: StageContext) -> StageContext:
    engine_args = dict(ctx.deploy.engine_args)
    if "hf_overrides" not in engine_args:
        why = vllm_thinker_importable()
        if why is not None:
            logger.warning("vLLM's Qwen3-Omni thinker is not importable here (%s); serving the thinker's language "
                           "model for text prompts", why)
            engine_args["hf_overrides"] = {"architectures": [ARCHITECTURE]}
    return replace(ctx, deploy=ctx.deploy.model_copy(update={"engine_args": engine_args}))


class ThinkerEngine(LLMStageEngine):
    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.defaults = load_omni_config(ctx.model).sampling_defaults("thinker") if ctx.model else {}

    def prepare(self, req: StageRequest) -> Prepared:
        if isinstance(req.params, Mapping):  # the checkpoint's generation config under the request's values
            req = replace(req, params={**self.defaults, **req.params})
        inputs = req.inputs
        if isinstance(inputs.get("prompt"), str) and inputs.get("messages") is None \
                and inputs.get("prompt_token_ids") is None and not inputs.get("multi_modal_data"):
            chat = {k: v for k, v in inputs.items() if k != "prompt"}
            chat["messages"] = [{"role": "user", "content": inputs["prompt"]}]
            req = replace(req, inputs=chat)
        return super().prepare(req)


def build_thinker_engine(ctx: StageContext) -> ThinkerEngine:
    return ThinkerEngine(thinker_context(ctx))
