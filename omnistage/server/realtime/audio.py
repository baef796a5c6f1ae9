"""Input audio of a realtime session: PCM16 at the session's rate -> one WAV at the model's rate, resampled
once (soxr, high quality) when the two differ, so the chat path decodes it without resampling again."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import soundfile

DEFAULT_MODEL_RATE = 16000  # Whisper-style audio encoders (Qwen2.5/3-Omni) hear 16 kHz


def model_input_rate(model_dir: str | Path | None) -> int:
    """The rate the model's feature extractor expects (its ``preprocessor_config.json``), else 16 kHz."""
    if model_dir:
        path = Path(model_dir) / "preprocessor_config.json"
        try:
            rate = json.loads(path.read_text()).get("sampling_rate")
            if isinstance(rate, int) and rate > 0:
                return rate
        except (OSError, ValueError, AttributeError):
            pass
    return DEFAULT_MODEL_RATE


def pcm16_to_wav(pcm: bytes, rate: int, model_rate: int) -> bytes:
    """Unchanged samples (16-bit WAV) at the model's rate; otherwise soxr's resampling, kept in float."""
    samples = np.frombuffer(pcm, dtype="<i2")
    buf = io.BytesIO()
    if rate == model_rate:
        soundfile.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    else:
        import soxr

        out = soxr.resample(samples.astype(np.float32) / 32768.0, rate, model_rate, quality="HQ")
        soundfile.write(buf, out.astype(np.float32), model_rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()
