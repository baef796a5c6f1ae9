"""Input audio of a realtime session: PCM16 at the session's rate -> one WAV at the model's rate, resampled
once (media_intake: soxr, high quality) when the two differ, so the chat path decodes it without resampling
again."""

from __future__ import annotations

import io

import numpy as np
import soundfile

from omnistage.media_intake import model_audio_rate as model_input_rate  # noqa: F401 - the session's target rate
from omnistage.media_intake import resample, wav_bytes


def pcm16_to_wav(pcm: bytes, rate: int, model_rate: int) -> bytes:
    """Unchanged samples (16-bit WAV) at the model's rate; otherwise soxr's resampling, kept in float."""
    samples = np.frombuffer(pcm, dtype="<i2")
    if rate != model_rate:
        return wav_bytes(resample(samples.astype(np.float32) / 32768.0, rate, model_rate), model_rate)
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()
