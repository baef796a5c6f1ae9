"""vLLM's multimodal processing for GLM-Image source images (image-to-image), public API only.

A source image reaches vLLM already tokenized: omnistage's AR stage runs the
model's own vision encoder and VQ (transformers) once, because the diffusion
stage needs the same ids. vLLM gets, per image, a dict
``{"image_token_ids": LongTensor[h*w], "image_grid_thw": LongTensor[3]}`` and a
prompt that already holds ``h*w`` ``<|image|>`` placeholders (as
``GlmImageProcessor`` writes it). The placeholders are kept as they are (the
prompt update replaces each run by itself) so vLLM knows where each image sits;
the model embeds the ids there (transformers' ``masked_scatter`` of the ids) and
reads the grid for the image tokens' 2-D positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from vllm.multimodal.parse import (
    DictEmbeddingItems,
    MultiModalDataItems,
    MultiModalDataParser,
)
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
    PromptUpdate,
)

FIELDS = frozenset({"image_token_ids", "image_grid_thw"})


def _fields(data: Mapping[str, torch.Tensor]) -> Mapping[str, MultiModalFieldConfig]:
    grids = data.get("image_grid_thw", torch.empty((0, 3), dtype=torch.long))
    return {
        "image_token_ids": MultiModalFieldConfig.flat_from_sizes("image", grids.prod(-1)),
        "image_grid_thw": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
    }


class _Parser(MultiModalDataParser):
    def _parse_image_data(self, data: Any):
        if not isinstance(data, Mapping):
            raise ValueError(
                "GLM-Image on vLLM takes source images as VQ token ids "
                "({'image_token_ids', 'image_grid_thw'}); omnistage's AR stage computes them"
            )
        return DictEmbeddingItems(data, modality="image", required_fields=FIELDS, fields_factory=_fields)


class GlmImageProcessingInfo(BaseProcessingInfo):
    def get_data_parser(self) -> MultiModalDataParser:
        return _Parser()

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None}

    def image_token_id(self) -> int:
        return int(self.get_hf_config().image_token_id)

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        return {"image": _dummy_tokens(seq_len, 1)}


def _dummy_tokens(seq_len: int, count: int) -> int:
    """Profiling: one image as large as the context allows (a few tokens left for text)."""
    return max(1, (seq_len - 8) // max(count, 1))


class GlmImageDummyInputs(BaseDummyInputsBuilder[GlmImageProcessingInfo]):
    def _size(self, mm_counts: Mapping[str, int]) -> tuple[int, int]:
        count = mm_counts.get("image", 0)
        return count, _dummy_tokens(self.info.ctx.model_config.max_model_len, count)

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        count, n = self._size(mm_counts)
        return self.info.get_tokenizer().decode([self.info.image_token_id()] * (n * count))

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Any = None):
        count, n = self._size(mm_counts)
        if not count:
            return {}
        return {
            "image": {
                "image_token_ids": torch.zeros(n * count, dtype=torch.long),
                "image_grid_thw": torch.tensor([[1, 1, n]] * count),
            }
        }


class GlmImageMultiModalProcessor(BaseMultiModalProcessor[GlmImageProcessingInfo]):
    def _get_mm_fields_config(
        self, hf_inputs: Any, hf_processor_mm_kwargs: Mapping[str, object]
    ) -> Mapping[str, MultiModalFieldConfig]:
        return _fields(hf_inputs)

    def _get_prompt_updates(
        self,
        mm_items: MultiModalDataItems,
        hf_processor_mm_kwargs: Mapping[str, object],
        out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        token = self.info.image_token_id()
        sizes = [int(item["image_grid_thw"].data.prod()) for item in out_mm_kwargs.get("image", [])]
        run = lambda i: [token] * sizes[i]  # noqa: E731 - the placeholder run of image i, kept as is
        return [PromptReplacement(modality="image", target=run, replacement=run)]
