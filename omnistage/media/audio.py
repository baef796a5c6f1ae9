"""An uploaded audio file -> float32 mono samples at the model's rate (libsndfile for WAV / FLAC, PyAV for the rest;
soxr resamples).

Any container and codec PyAV (FFmpeg) opens: wav, mp3, flac, ogg/opus, m4a, webm. Channels are averaged
(as librosa and vLLM's own loader downmix); a rate other than the model's is resampled once with soxr's
high-quality filter. Decoding is audio_decode.py's: a file that is not audio is a 400 naming the field; a
file longer than ``max_seconds`` (or the server's ``--max-audio-seconds``) is refused from its header, or
while decoding, before any model work.
"""

from __future__ import annotations

import numpy as np

from omnistage.errors import bad_request
from omnistage.media.audio_decode import decode_audio_av, read_audio
from omnistage.media.limits import MediaLimits
from omnistage.media_intake import resample


def decode_audio(
    data: bytes, field: str, rate: int, max_seconds: float, limits: MediaLimits | None = None, mime: str | None = None
) -> np.ndarray:
    samples, native = decode_native(data, field, max_seconds, limits, mime)
    if not np.isfinite(samples).all():
        raise bad_request(f"{field}: the audio has non-finite samples", field)
    return resample(samples, native, rate)  # once, soxr HQ (media_intake: the one resampler of every input)


def decode_native(
    data: bytes,
    field: str,
    max_seconds: float | None = None,
    limits: MediaLimits | None = None,
    mime: str | None = None,
) -> tuple[np.ndarray, int]:
    """float32 mono (channels averaged) at the file's own rate, by the decoder every audio input uses."""
    # WAV and FLAC through libsndfile in large blocks: the same samples as PyAV's, without its Python loop over
    # ~1000-sample frames (that loop was ~30% of the transcription route's CPU; benchmarks/asr_serve.py)
    decode = read_audio if _sndfile_format(data) else decode_audio_av
    return decode(data, field, limits or MediaLimits(), max_seconds, mime)


def _sndfile_format(data: bytes) -> bool:
    return (data[:4] == b"RIFF" and data[8:12] == b"WAVE") or data[:4] == b"fLaC"
