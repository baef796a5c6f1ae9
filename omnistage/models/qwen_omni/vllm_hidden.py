"""The Qwen3-Omni thinker as a vLLM pooling model that returns the residual stream the talker reads.

transformers' talker takes, at the prompt's media positions, ``hidden_projection`` of the thinker's
hidden state after layer ``accept_hidden_layer`` (the residual stream, before any final norm).
vLLM's public API returns no hidden states from a generating engine, so the thinker stage runs a
second engine of the same folder in pooling mode (``runner="pooling"``, ``token_embed``) on this
model: vLLM's own ``Qwen3OmniMoeThinkerForConditionalGeneration`` (same encoders, same multimodal
processing, same M-RoPE), cut to its first ``accept_hidden_layer`` decoder layers (the deploy
overrides ``num_hidden_layers``; the later layers' weights are skipped, so this copy holds only
what that layer needs), whose output is the auxiliary hidden state vLLM's ``SupportsEagle3``
interface captures after the last kept layer (``hidden + residual``: the un-normed stream).

Registered through the ``vllm.general_plugins`` entry point (``vllm_plugin.py``); no vLLM internals
are patched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_omni_moe_thinker import Qwen3OmniMoeThinkerForConditionalGeneration

_LAYER = re.compile(r"^thinker\.model\.layers\.(\d+)\.")


class Qwen3OmniThinkerHiddenForVLLM(Qwen3OmniMoeThinkerForConditionalGeneration):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.num_layers = self.config.text_config.num_hidden_layers  # = accept_hidden_layer (deploy override)
        self.set_aux_hidden_state_layers((self.num_layers,))

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        _, (after_last_layer,) = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        return after_last_layer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def kept(name: str) -> bool:
            m = _LAYER.match(name)
            return m is None or int(m.group(1)) < self.num_layers

        return super().load_weights((name, w) for name, w in weights if kept(name))
