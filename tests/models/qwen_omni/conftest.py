"""Shared by the qwen_omni tests: the tiny folder and transformers' own generate() as the reference."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch


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

        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        self._cache: dict = {}

    def prompt_ids(self, messages) -> list[int]:
        out = self.tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return list(out["input_ids"])

    def run(self, messages, thinker_tokens: int, talker_tokens: int, speaker: str = "Ethan") -> Reference:
        key = (repr(messages), thinker_tokens, talker_tokens, speaker)
        if key not in self._cache:
            ids = self.prompt_ids(messages)
            seen: list[torch.Tensor] = []  # code2wav's inputs (one forward: every test stays under its 300-frame chunk)
            hook = self.model.code2wav.register_forward_pre_hook(lambda module, args: seen.append(args[0][0].clone()))
            try:
                with torch.no_grad():
                    seq, wav = self.model.generate(
                        input_ids=torch.tensor([ids]), speaker=speaker, thinker_max_new_tokens=thinker_tokens,
                        thinker_do_sample=False, talker_max_new_tokens=talker_tokens, talker_do_sample=False,
                        thinker_eos_token_id=self.tok.convert_tokens_to_ids("<|im_end|>"))
            finally:
                hook.remove()
            assert len(seen) == 1, "a reference longer than one code2wav chunk"
            self._cache[key] = Reference(ids, seq[0, len(ids):].tolist(), seen[0], wav.reshape(-1).float())
        return self._cache[key]


@pytest.fixture(scope="session")
def reference(omni_dir):
    return TransformersReference(omni_dir)
