"""A reference clip as OmniVoice clones from it (the package's ``create_voice_clone_prompt`` with its
transcript given): the clip's loudness, a quiet clip raised to it, silences over 200 ms shortened, the edges
trimmed, whole codec frames kept, then the Higgs Audio v2 tokenizer's encoder; the transcript ends with
punctuation."""

from __future__ import annotations

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.omnivoice.postprocess import REF_RMS_FLOOR, remove_silence

MID_SILENCE_MS, LEAD_SILENCE_MS, TRAIL_SILENCE_MS = 200, 100, 200  # the clip's silence rules
_END_PUNCTUATION = set(";:,.!?…)]}\"'“”‘’；：，。！？、）】")
_HAN = ("\u4e00", "\u9fff")


def with_end_punctuation(text: str) -> str:
    text = text.strip()
    if text and text[-1] not in _END_PUNCTUATION:
        text += "。" if any(_HAN[0] <= c <= _HAN[1] for c in text) else "."
    return text


def prepare_clip(clip: np.ndarray, rate: int, hop: int) -> tuple[np.ndarray, float]:
    """Mono float32 at the codec's rate -> (the samples to encode, the clip's RMS as given). Empty when the
    clip is all silence."""
    wav = np.asarray(clip, dtype=np.float32)[None]  # [1, T]: the mean's float32 summation as the package's
    rms = float(np.sqrt(np.mean(wav**2)))
    if 0 < rms < REF_RMS_FLOOR:
        wav = wav * REF_RMS_FLOOR / rms
    wav = remove_silence(wav[0], rate, MID_SILENCE_MS, LEAD_SILENCE_MS, TRAIL_SILENCE_MS)
    return wav[: wav.size - wav.size % hop], rms


def clip_codes(encoder, clip: np.ndarray, rate: int, hop: int) -> tuple[torch.Tensor, float]:
    """codes [C, frames] of the prepared clip and its RMS (``encoder``: ``HiggsAudioEncoder``)."""
    wav, rms = prepare_clip(clip, rate, hop)
    if wav.size == 0:
        raise InvalidRequestError("ref_audio", "the reference clip is silent (nothing left after trimming)")
    return encoder.encode(wav), rms
