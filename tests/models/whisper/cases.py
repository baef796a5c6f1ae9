"""Clips, settings and helpers shared by the recogniser parity tests (Whisper, Qwen3-ASR, Voxtral) and the
transcription route's."""

from __future__ import annotations

import numpy as np

from omnistage.testing.streams import all_outputs

ENGINE = dict(max_model_len=448, max_num_seqs=8, dtype="float32", enforce_eager=True)
MAX_TOKENS = 24
RATE = 16000


def clip(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    """A deterministic tone-and-noise clip (float32 mono)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    freq = 220.0 * (1 + seed % 5)
    return (0.3 * np.sin(2 * np.pi * freq * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def request(audio, language="en", task="transcribe", previous=""):
    """A recogniser request as the transcription routes build it (omnistage/models/shared/whisper/prompt.py)."""
    return {
        "prompt": previous,
        "multi_modal_data": {"audio": (audio, RATE)},
        "additional_information": {"language": language, "task": task},
    }


async def run(omni, prompt, **params):
    """One request through the family's engine: (its final output, every delta)."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params or None]))
    return outs[-1], [o.delta for o in outs]


CLIPS = [clip(2.0, 1), clip(5.5, 2), clip(11.0, 3)]
# (language, task, previous text) per case; the decoder prompt the family builds from them
CASES = [
    ("en", "transcribe", ""),
    ("de", "transcribe", ""),
    ("fr", "translate", ""),
    ("en", "transcribe", "hello world"),
]


def between_timestamps(segment: list[int], begin: int) -> list[int]:
    """The tokens of a transformers Whisper segment (``generate(return_segments=True)``) without the timestamps
    around them: it keeps the opening one, the closing one, and for an unfinished last segment the next
    pair's first too."""
    inner = segment[1:]
    while inner and inner[-1] >= begin:
        inner.pop()
    return inner


class TransformersWhisper:
    """The reference for text out of the CLI and of pipelines with a Whisper stage: transformers' Whisper on the
    folder, greedy (the family equals it token for token: test_whisper_vllm.py)."""

    def __init__(self, folder: str):
        import torch
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        torch.set_num_threads(1)
        self.proc = WhisperProcessor.from_pretrained(folder)
        self.model = WhisperForConditionalGeneration.from_pretrained(folder).eval()

    def features(self, samples):
        return self.proc(samples, sampling_rate=RATE, return_tensors="pt").input_features

    def language(self, samples) -> str:
        import torch

        with torch.no_grad():
            token = int(self.model.detect_language(self.features(samples))[0])
        return self.proc.tokenizer.convert_ids_to_tokens(token)[2:-2]  # <|de|> -> de

    def transcript(self, samples, language: str, max_tokens: int) -> str:
        import torch

        with torch.no_grad():
            ids = self.model.generate(
                self.features(samples), language=language, task="transcribe", do_sample=False, max_new_tokens=max_tokens
            )
        return self.proc.tokenizer.decode(ids[0], skip_special_tokens=True)
