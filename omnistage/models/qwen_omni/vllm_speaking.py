"""vLLM's own Qwen3-Omni thinker, also keeping the residual stream the talker reads, for a KV connector to hand out.

transformers' talker takes, at the prompt's media positions, ``hidden_projection`` of the thinker's hidden state
after layer ``accept_hidden_layer`` (the residual stream, before any norm). This model is vLLM's
``Qwen3OmniMoeThinkerForConditionalGeneration`` with that layer's auxiliary hidden state captured (vLLM's public
``SupportsEagle3.set_aux_hidden_state_layers``) and written, for every token the engine computes, into a
cache-only attention layer (vLLM's ``CacheOnlyAttentionLayer``: a KV-cache group of its own). The thinker stage
runs the engine with ``stages/llm/hidden_connector.py``, which writes a request's prompt rows to a file when its
prefill ends. Its generation is vLLM's model's: the forward returns the same final hidden states.

Registered through the ``vllm.general_plugins`` entry point (``vllm_plugin.py``); no vLLM internals are patched.
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer
from vllm.model_executor.models.qwen3_omni_moe_thinker import Qwen3OmniMoeThinkerForConditionalGeneration
from vllm.model_executor.models.utils import maybe_prefix

from omnistage.stages.llm.hidden import LAYER


class Qwen3OmniThinkerSpeakingForVLLM(Qwen3OmniMoeThinkerForConditionalGeneration):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        self.set_aux_hidden_state_layers((config.talker_config.accept_hidden_layer,))
        text = self.config.text_config
        # (named as the connector finds it; vLLM orders cache layers by the integer: this one after the decoder's)
        self.talker_hidden = CacheOnlyAttentionLayer(
            num_heads=1, head_size=text.hidden_size, prefix=maybe_prefix(prefix, f"{LAYER}.{text.num_hidden_layers}")
        )

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        hidden, (accepted,) = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        self.talker_hidden(accepted.unsqueeze(1))  # [tokens, 1, hidden] into its cache
        return hidden
