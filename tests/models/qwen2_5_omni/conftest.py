"""Shared by the qwen2_5_omni tests: the tiny folder and transformers' own generate() as the reference."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import pytest
import torch

from omnistage.testing.run_cache import shared

SEED = 7  # token2wav's noise: the stage's own generator, transformers' global one after manual_seed


@pytest.fixture(scope="session")
def omni25_dir(tiny_model):
    return tiny_model("qwen2_5_omni")


@dataclass
class Reference:
    prompt_ids: list[int]
    reply: list[int]  # thinker tokens generated (its end-of-turn token included when it stopped there)
    codes: torch.Tensor  # [n] the talker's codes, as token2wav got them
    audio: torch.Tensor  # [samples] float32


class TransformersReference:
    """``Qwen2_5OmniForConditionalGeneration.generate(..., return_audio=True)``, greedy thinker and talker, the
    noise seeded with ``torch.manual_seed(SEED)``.

    The request runs as row 0 of a batch beside a shorter, left-padded companion prompt. transformers 5.19's
    generate() drops an all-ones attention mask, and its talker's forward adds the ``codec_pad`` / ``codec_bos``
    embeddings to the prefill and positions it with ``get_rope_index`` only when it has a mask: alone, a request
    skips both (its batched rows do not). The padded batch is the path where transformers computes the talker's
    conditioning as its own forward defines it, and what omnistage computes (docs/families/qwen2_5_omni.md); row 0 has no padding, and token2wav decodes it first (first draw of the seeded RNG)."""

    COMPANION = [{"role": "user", "content": "hi"}]

    def __init__(self, folder):
        from transformers import Qwen2_5OmniForConditionalGeneration

        self.folder = folder
        self.model = Qwen2_5OmniForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
        self._cache: dict = {}

    @cached_property
    def processor(self):
        from transformers import Qwen2_5OmniProcessor

        return Qwen2_5OmniProcessor.from_pretrained(str(self.folder))

    @property
    def tok(self):
        return self.processor.tokenizer

    def template(self, messages) -> str:
        return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def run(
        self,
        messages,
        thinker_tokens: int,
        talker_tokens: int,
        speaker: str = "Chelsie",
        mm: dict | None = None,
        **kwargs,
    ) -> Reference:
        key = (repr(messages), repr(mm), thinker_tokens, talker_tokens, speaker, repr(kwargs))
        if key not in self._cache:  # once per test run, for both xdist workers (omnistage/testing/run_cache.py)
            self._cache[key] = shared(
                f"qwen2_5-omni-transformers-{hashlib.sha256(repr(key).encode()).hexdigest()}",
                lambda: self._run(self.template(messages), thinker_tokens, talker_tokens, speaker, mm or {}, **kwargs),
            )
        return self._cache[key]

    def _run(self, prompt: str, thinker_tokens: int, talker_tokens: int, speaker: str, mm: dict, **kwargs):
        inputs = self.processor(
            text=[prompt, self.template(self.COMPANION)], return_tensors="pt", padding=True, **mm, **kwargs
        )
        # transformers 5.19's generate() hands every processor output it does not route (pixels included) to the
        # talker too, whose generate() refuses pixels as unused model kwargs; its talker_* prefix routes None there
        routing = {f"talker_{k}": None for k in ("pixel_values", "pixel_values_videos") if k in inputs}
        mask = inputs["attention_mask"]
        assert mask[0].all() and not mask[1].all(), "the companion must be the shorter (padded) row"
        seen: list[torch.Tensor] = []
        hook = self.model.token2wav.register_forward_pre_hook(lambda module, args: seen.append(args[0][0].clone()))
        try:
            torch.manual_seed(SEED)
            with torch.no_grad():
                seq, wavs = self.model.generate(
                    **inputs,
                    speaker=speaker,
                    thinker_max_new_tokens=thinker_tokens,
                    thinker_do_sample=False,
                    talker_max_new_tokens=talker_tokens,
                    talker_do_sample=False,
                    thinker_eos_token_id=self.tok.convert_tokens_to_ids("<|im_end|>"),
                    **routing,
                    **kwargs,
                )
        finally:
            hook.remove()
        ids = inputs["input_ids"][0].tolist()
        reply = seq[0, len(ids) :].tolist()
        end = self.tok.convert_tokens_to_ids("<|im_end|>")
        reply = reply[: reply.index(end) + 1] if end in reply else reply  # the batch pads a finished row
        return Reference(ids, reply, seen[0], wavs[0].reshape(-1).float())


@pytest.fixture(scope="session")
def reference(omni25_dir):
    return TransformersReference(omni25_dir)
