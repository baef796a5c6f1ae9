"""The Qwen2.5-Omni thinker (``vllm_thinker.py``: vLLM's own, transformers' positions) that also keeps the hidden
state the talker reads, for a KV connector to hand out.

transformers' talker reads the thinker's last-layer hidden state (after the final norm) of every prompt token and
of every reply token fed back. That is exactly what vLLM's model forward returns (``compute_logits`` applies only
the LM head), so this model writes its own output, for every token the engine computes, into a cache-only
attention layer (vLLM's ``CacheOnlyAttentionLayer``: a KV-cache group of its own). The thinker stage runs the engine
with ``stages/llm/hidden_connector.py``, which copies a request's rows into a file each step. Its generation is
the plain thinker's: the forward returns the same hidden states.

Registered through the ``vllm.general_plugins`` entry point (``vllm_plugin.py``); no vLLM internals are patched.
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer
from vllm.model_executor.models.utils import maybe_prefix

from omnistage.models.qwen2_5_omni.vllm_thinker import Qwen2_5OmniThinkerForVLLM
from omnistage.stages.llm.hidden import LAYER


class Qwen2_5OmniThinkerSpeakingForVLLM(Qwen2_5OmniThinkerForVLLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        text = self.config.text_config
        # (named as the connector finds it; vLLM orders cache layers by the integer: this one after the decoder's)
        self.talker_hidden = CacheOnlyAttentionLayer(
            num_heads=1, head_size=text.hidden_size, prefix=maybe_prefix(prefix, f"{LAYER}.{text.num_hidden_layers}")
        )

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        hidden = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        self.talker_hidden(hidden.unsqueeze(1))  # [tokens, 1, hidden] into its cache
        return hidden
