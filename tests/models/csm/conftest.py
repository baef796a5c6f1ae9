"""Shared by the csm tests: the tiny folder, and transformers' own ``generate`` as the reference."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pytest
import torch


@pytest.fixture(scope="session")
def csm_dir(tiny_model):
    return tiny_model("csm")


def clip(seed: int, seconds: float = 1.2, rate: int = 24000) -> np.ndarray:
    """A reference clip: noise with a pitch, mono float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * (150 + 50 * seed) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


@dataclass
class Generated:
    codes: torch.Tensor  # [frames, K], cut before the end frame as transformers cuts it for the codec
    audio: torch.Tensor  # [samples] float32: transformers' Mimi decode of the codes


class TransformersReference:
    """``CsmForConditionalGeneration.generate(..., output_audio=True)`` on the processor's chat template."""

    def __init__(self, folder):
        from transformers import AutoProcessor, CsmForConditionalGeneration

        self.processor = AutoProcessor.from_pretrained(str(folder))
        self.model = CsmForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        # generate() writes its depth_decoder_* kwargs into the depth decoder's generation config for good:
        # every call starts again from the checkpoint's
        self._depth_config = copy.deepcopy(self.model.depth_decoder.generation_config)
        self._cache: dict = {}

    def run(
        self, turns: list[tuple[str, str, np.ndarray | None]], frames: int, seed: int | None = None, **sampling
    ) -> Generated:
        """``turns``: (speaker, text, audio or None); ``sampling``: generate kwargs (greedy by default)."""
        key = (
            repr([(s, t, None if a is None else a.tobytes()) for s, t, a in turns]),
            frames,
            seed,
            tuple(sorted(sampling.items())),
        )
        if key not in self._cache:
            conversation = [
                {
                    "role": s,
                    "content": [{"type": "text", "text": t}]
                    + ([{"type": "audio", "path": a}] if a is not None else []),
                }
                for s, t, a in turns
            ]
            inputs = self.processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
            kwargs = sampling or {"do_sample": False, "depth_decoder_do_sample": False}
            self.model.depth_decoder.generation_config = copy.deepcopy(self._depth_config)
            if seed is not None:
                torch.manual_seed(seed)
            with torch.no_grad():
                out = self.model.generate(
                    **inputs, max_new_tokens=frames, output_audio=True, return_dict_in_generate=True, **kwargs
                )
            codes = out.sequences[0]
            end = (codes[:, :-1] == self.model.config.codebook_eos_token_id).all(-1).nonzero()
            codes = codes[: int(end.min())] if end.numel() else codes
            self._cache[key] = Generated(codes, out.audio[0].float())
        return self._cache[key]


@pytest.fixture(scope="session")
def reference(csm_dir):
    return TransformersReference(csm_dir)
