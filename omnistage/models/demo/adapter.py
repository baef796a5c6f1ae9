"""The sd3 family's adapter, loading a folder that has no T5 encoder."""

from __future__ import annotations

import torch

from omnistage.models.sd3.adapter import SD3Adapter


class DemoAdapter(SD3Adapter):
    @classmethod
    def load(cls, folder: str, dtype: torch.dtype, device: torch.device) -> "DemoAdapter":
        from diffusers import StableDiffusion3Pipeline

        # diffusers saves a missing T5 as [null, null] but refuses to load it unless told it is absent;
        # the SD3 pipeline then feeds zeros in its place (what the demo was trained with).
        pipe = StableDiffusion3Pipeline.from_pretrained(folder, dtype=dtype, text_encoder_3=None, tokenizer_3=None)
        pipe.to(device)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, dtype, device)
