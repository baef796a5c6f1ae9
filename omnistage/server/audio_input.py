"""An uploaded audio file -> float32 mono samples at the model's rate (PyAV decodes, soxr resamples).

Any container and codec PyAV (FFmpeg) opens: wav, mp3, flac, ogg/opus, m4a, webm. Channels are averaged
(as librosa and vLLM's own loader downmix); a rate other than the model's is resampled once with soxr's
high-quality filter. A file that is not audio is a 400 naming the field; a file longer than
``max_seconds`` is refused while decoding, before any model work.
"""

from __future__ import annotations

import io

import numpy as np

from omnistage.server.errors import bad_request


def decode_audio(data: bytes, field: str, rate: int, max_seconds: float) -> np.ndarray:
    import av

    pieces: list[np.ndarray] = []
    native = 0
    total = 0
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise bad_request(f"{field}: not an audio file (no audio stream)", field)
            stream = container.streams.audio[0]
            # planar float, channels kept: averaged here rather than by FFmpeg's mixing matrix
            resampler = av.AudioResampler(format="fltp")
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    native = out.sample_rate
                    pieces.append(out.to_ndarray().mean(axis=0))
                    total += pieces[-1].size
                    if total > max_seconds * native:
                        raise bad_request(f"{field}: longer than {max_seconds:g} s (--max-audio-seconds)", field)
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as e:  # (an APIError passes through)
        raise bad_request(f"{field}: not a decodable audio file ({type(e).__name__})", field) from None
    if not total:
        raise bad_request(f"{field}: the audio has no samples", field)
    samples = np.concatenate(pieces).astype(np.float32)
    if not np.isfinite(samples).all():
        raise bad_request(f"{field}: the audio has non-finite samples", field)
    if native != rate:
        import soxr

        samples = soxr.resample(samples, native, rate, quality="HQ").astype(np.float32)
    return samples
