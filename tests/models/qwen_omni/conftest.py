"""Shared by the qwen_omni tests: the tiny folder and transformers' own generate() as the reference."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import pytest
import torch

from omnistage.models.qwen_omni.checkpoint import with_thinker_audio_window
from omnistage.testing.run_cache import shared


@pytest.fixture(scope="session")
def omni_dir(tiny_model):
    return tiny_model("qwen3_omni")


@dataclass
class Reference:
    prompt_ids: list[int]
    reply: list[int]  # thinker tokens generated (its end-of-turn token included when it stopped there)
    codes: torch.Tensor  # [G, frames] the talker's codes, as code2wav got them
    audio: torch.Tensor  # [samples] float32


class TransformersReference:
    """``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)``, greedy thinker and talker."""

    def __init__(self, folder):
        from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

        self.folder = folder
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        # transformers 5.19's talker cannot position a prompt with audio and vision (no audio_config): the same
        # one-attribute fix the talker stage makes (checkpoint.with_thinker_audio_window)
        with_thinker_audio_window(self.model.config)
        self.model.talker.config.audio_config = self.model.config.thinker_config.audio_config
        self._cache: dict = {}

    @cached_property
    def processor(self):
        from transformers import Qwen3OmniMoeProcessor

        return Qwen3OmniMoeProcessor.from_pretrained(str(self.folder))

    def prompt_ids(self, messages) -> list[int]:
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return list(out["input_ids"])

    def run(self, messages, thinker_tokens: int, talker_tokens: int, speaker: str = "Ethan") -> Reference:
        key = (repr(messages), thinker_tokens, talker_tokens, speaker)
        if key not in self._cache:  # once per test run, for both xdist workers (omnistage/testing/run_cache.py)
            self._cache[key] = shared(
                f"qwen3-omni-transformers-{hashlib.sha256(repr(key).encode()).hexdigest()}",
                lambda: self.run_inputs(
                    {"input_ids": torch.tensor([self.prompt_ids(messages)])}, thinker_tokens, talker_tokens, speaker
                ),
            )
        return self._cache[key]

    def run_inputs(
        self, inputs: dict, thinker_tokens: int, talker_tokens: int, speaker: str = "Ethan", **kwargs
    ) -> Reference:
        """generate() on ``inputs`` as the model's processor makes them (ids, features, pixels, grids)."""
        ids = inputs["input_ids"][0].tolist()
        seen: list[torch.Tensor] = []  # code2wav's inputs (one forward: every test stays under its 300-frame chunk)
        hook = self.model.code2wav.register_forward_pre_hook(lambda module, args: seen.append(args[0][0].clone()))
        try:
            with torch.no_grad():
                seq, wav = self.model.generate(
                    **inputs,
                    speaker=speaker,
                    thinker_max_new_tokens=thinker_tokens,
                    thinker_do_sample=False,
                    talker_max_new_tokens=talker_tokens,
                    talker_do_sample=False,
                    thinker_eos_token_id=self.tok.convert_tokens_to_ids("<|im_end|>"),
                    **kwargs,
                )
        finally:
            hook.remove()
        assert len(seen) == 1, "a reference longer than one code2wav chunk"
        return Reference(ids, seq[0, len(ids) :].tolist(), seen[0], wav.reshape(-1).float())


@pytest.fixture(scope="session")
def reference(omni_dir):
    return TransformersReference(omni_dir)
