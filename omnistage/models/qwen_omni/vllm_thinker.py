"""The thinker's language model as a vLLM model, for installations where vLLM's own
Qwen3-Omni thinker cannot be imported.

vLLM 0.32's ``Qwen3OmniMoeThinkerForConditionalGeneration`` imports its vision
processing from transformers' torchvision-backed Qwen2-VL image processor; with no
torchvision (no CPU build exists for the torch this project pins) the module fails
to import, so the architecture cannot be served at all. The thinker's language model
itself is vLLM's Qwen3-MoE: this class is that model, reading the thinker's text
config (``thinker_config.text_config``, which vLLM already resolves as the folder's
text config) and the ``thinker.model.*`` / ``thinker.lm_head.*`` weights of the
Qwen3-Omni checkpoint, skipping the encoders, the talker and code2wav.

Exact for text prompts: the thinker's M-RoPE gives a text token the same position on
all three axes (``get_mrope_input_positions`` below, vLLM's ``SupportsMRoPE``
interface, which the folder's ``mrope_section`` makes vLLM ask for).
Registered through the ``vllm.general_plugins`` entry point (``vllm_plugin.py``) and
selected per engine with ``hf_overrides={"architectures": [ARCHITECTURE]}``; no vLLM
internals are patched.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.interfaces import SupportsMRoPE
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM
from vllm.model_executor.models.utils import WeightsMapper

ARCHITECTURE = "OmnistageQwen3OmniThinkerText"
_THINKER_TEXT = ("thinker.model.", "thinker.lm_head.")


class Qwen3OmniThinkerTextForVLLM(Qwen3MoeForCausalLM, SupportsMRoPE):
    # checkpoint names -> this model's (Qwen3-MoE's own mapper then fuses q/k/v and gate/up)
    prefix_mapper = WeightsMapper(orig_to_new_prefix={"thinker.model.": "model.", "thinker.lm_head.": "lm_head."})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        thinker = ((name, w) for name, w in weights if name.startswith(_THINKER_TEXT))
        return super().load_weights(self.prefix_mapper.apply(thinker))

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list) -> tuple[torch.Tensor, int]:
        """Text only: token i sits at position i on the temporal, height and width axes alike."""
        if mm_features:
            raise ValueError("this Qwen3-Omni thinker serves text prompts only (vLLM's own thinker model, "
                             "which needs torchvision, takes images, audio and video)")
        n = len(input_tokens)
        return torch.arange(n).unsqueeze(0).expand(3, n).clone(), 0
