"""vLLM's own Qwen2.5-Omni thinker with transformers' M-RoPE positions.

vLLM 0.32's ``Qwen2_5OmniThinkerForConditionalGeneration.get_mrope_input_positions`` places a video with its
audio (``use_audio_in_video``) one token off: transformers' ``get_rope_index`` gives ``<|vision_bos|>`` and
``<|audio_bos|>`` one shared position (likewise ``<|audio_eos|><|vision_eos|>``), vLLM gives ``<|audio_bos|>``
the first video position and every later token of the block one more, so the text after it starts 3 positions
later than in transformers (the thinker then generates other tokens). Text, audio, image and video-only
prompts get the same positions from both.

This class overrides only that method (vLLM's ``SupportsMRoPE`` model-author interface) and computes the
positions with transformers' own ``get_rope_index``, from the grids and audio lengths of the ``mm_features``
vLLM passes. Registered through the ``vllm.general_plugins`` entry point (``vllm_plugin.py``) and selected by
the thinker deploy's ``hf_overrides``; no vLLM internals are patched.
"""

from __future__ import annotations

import copy

import torch
from transformers import Qwen2_5OmniPreTrainedModelForConditionalGeneration
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen2_5_omni_thinker import Qwen2_5OmniThinkerForConditionalGeneration
from vllm.multimodal.inputs import MultiModalFeatureSpec


class _RopeIndex(Qwen2_5OmniPreTrainedModelForConditionalGeneration):
    """transformers' position functions (``get_rope_index`` and its helpers), no weights: the thinker sets
    ``spatial_merge_size`` in its own ``__init__``, which this class does not run."""

    def __init__(self, thinker_config):
        super().__init__(thinker_config)
        self.spatial_merge_size = thinker_config.vision_config.spatial_merge_size


class Qwen2_5OmniThinkerForVLLM(Qwen2_5OmniThinkerForConditionalGeneration):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # a bound method, not a submodule: vLLM's weight loading walks submodules; a copy, as transformers'
        # model init writes attention settings into its config
        self._rope_index = _RopeIndex(copy.deepcopy(self.config)).get_rope_index

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list[MultiModalFeatureSpec]
    ) -> tuple[torch.Tensor, int]:
        def value(feature: MultiModalFeatureSpec, key: str) -> torch.Tensor | None:
            item = feature.data.get(key) if feature.data is not None else None
            return None if item is None else torch.as_tensor(item.data)

        # transformers reads each modality's items in prompt order; a video's own audio shares its offset
        features = sorted(mm_features, key=lambda f: f.mm_position.offset)
        by = {m: [f for f in features if f.modality == m] for m in ("image", "video", "audio")}

        def stacked(modality: str, key: str, default: float | None = None) -> torch.Tensor | None:
            found = [value(f, key) for f in by[modality]]
            found = [torch.tensor(default) if v is None and default is not None else v for v in found]
            return torch.stack([v.reshape(-1) for v in found]) if found else None

        grids = stacked("video", "video_grid_thw")
        seconds = stacked("video", "second_per_grid_ts", default=1.0)  # vLLM's default when the processor gave none
        in_video = [value(f, "use_audio_in_video") for f in by["video"]]
        ids = torch.tensor([input_tokens], dtype=torch.long)
        positions, delta = self._rope_index(
            input_ids=ids,
            image_grid_thw=stacked("image", "image_grid_thw"),
            video_grid_thw=grids,
            attention_mask=torch.ones_like(ids),  # its text-only path (no image or video) needs the mask
            use_audio_in_video=any(v is not None and bool(v.item()) for v in in_video),
            audio_seqlens=stacked("audio", "audio_feature_lengths").reshape(-1) if by["audio"] else None,
            second_per_grids=None if seconds is None else seconds.reshape(-1),
        )
        return positions[:, 0], int(delta.reshape(-1)[0])
