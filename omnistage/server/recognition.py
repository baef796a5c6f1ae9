"""How a recogniser is fed, shared by the transcription routes and ``omnistage generate --audio``: long audio cut
into the model's windows, and Whisper's language probe on the first one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from omnistage.server.errors import APIError
from omnistage.speech import Transcription

DEFAULT_MAX_AUDIO_S = 3600.0  # one upload; longer files are refused while decoding
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}  # texts of windows join without a space


def windows(
    samples: np.ndarray, rate: int, window_s: float, overlap_s: float = 1.0, energy_window: int = 1600
) -> list[tuple[float, np.ndarray]]:
    """(offset in seconds, samples) per model window, in order, cut as ``vllm serve`` cuts long audio
    (vllm.multimodal.audio.split_audio): each window ends at the quietest ``energy_window`` samples of its
    last ``overlap_s``, so a cut falls in a pause rather than through a word."""
    size, overlap = int(rate * window_s), int(rate * overlap_s)
    out, i = [], 0
    while i < samples.size:
        if i + size >= samples.size:
            out.append((i / rate, samples[i:]))
            break
        start, end = i + size - overlap, min(i + size, samples.size)
        split, quietest = start, np.inf
        for k in range(0, end - start - energy_window, energy_window):
            energy = float(np.sqrt(np.mean(samples[start + k : start + k + energy_window] ** 2)))
            if energy < quietest:
                split, quietest = start + k, energy
        split = split if split > i else min(i + size, samples.size)
        out.append((i / rate, samples[i:split]))
        i = split
    return out


def language_probe(piece: np.ndarray, rate: int, ids: Mapping[str, int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The prompt and llm params that make the spoken language Whisper's next token, as openai-whisper,
    transformers and ``vllm serve`` detect it: one greedy token after the start token, over the language tokens
    only, on the first window. The route and ``omnistage generate --audio`` both ask this way."""
    prompt = {
        "prompt": "",
        "multi_modal_data": {"audio": (piece, rate)},
        "transcription": Transcription(detect_language=True),
    }
    return prompt, {"max_tokens": 1, "temperature": 0.0, "allowed_token_ids": list(ids.values())}


def language_of(token_ids: list[int], ids: Mapping[str, int]) -> str:
    by_id = {v: k for k, v in ids.items()}
    if not token_ids or token_ids[0] not in by_id:
        raise APIError(500, f"language detection gave no language token ({token_ids})", code="language_detection")
    return by_id[token_ids[0]]
