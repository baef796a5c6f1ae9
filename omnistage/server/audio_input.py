"""An uploaded audio file -> float32 mono samples at the model's rate (PyAV decodes, soxr resamples).

Any container and codec PyAV (FFmpeg) opens: wav, mp3, flac, ogg/opus, m4a, webm. Channels are averaged
(as librosa and vLLM's own loader downmix); a rate other than the model's is resampled once with soxr's
high-quality filter. Decoding is decode_limits.py's: a file that is not audio is a 400 naming the field; a
file longer than ``max_seconds`` (or the server's ``--max-audio-seconds``) is refused from its header, or
while decoding, before any model work.
"""

from __future__ import annotations

import numpy as np

from omnistage.server.decode_limits import decode_audio_av
from omnistage.server.errors import bad_request
from omnistage.server.media_fetch import MediaLimits


def decode_audio(data: bytes, field: str, rate: int, max_seconds: float, limits: MediaLimits | None = None,
                 mime: str | None = None) -> np.ndarray:
    samples, native = decode_audio_av(data, field, limits or MediaLimits(), max_seconds, mime)
    if not np.isfinite(samples).all():
        raise bad_request(f"{field}: the audio has non-finite samples", field)
    if native != rate:
        import soxr

        samples = soxr.resample(samples, native, rate, quality="HQ").astype(np.float32)
    return samples
