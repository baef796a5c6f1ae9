"""The one normal form of the media a caller brings, offline and over HTTP, applied before any engine sees them.

- audio: channels averaged, then resampled once with soxr's high-quality filter to the rate the model hears
  (vLLM's own resampler would want torchaudio; every path hands it audio already at the model's rate);
- images: EXIF orientation applied, the first frame of an animation, then PIL's ``convert("RGB")`` (the order
  diffusers' ``load_image`` uses), whatever mode PIL opened (RGBA, LA, P, CMYK, I;16, 1).

Bounded decoding of the bytes a client sends (any container and codec FFmpeg opens, any frame rate for
video) is media/decode.py's (and audio_decode.py's); this module is what both the server and the engine's
stages apply to what was decoded. Cheap to import: no server, engine or vLLM imports.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_AUDIO_RATE = 16000  # Whisper-style audio encoders (Qwen2-Audio, Qwen2.5/3-Omni) hear 16 kHz


@functools.lru_cache(maxsize=64)
def model_audio_rate(model_dir: str | Path | None) -> int:
    """The rate the model's feature extractor expects (its ``preprocessor_config.json``, in the folder or the
    hub cache), else 16 kHz; read once per model (every chat request with audio asks)."""
    if model_dir:
        path = Path(model_dir) / "preprocessor_config.json"
        if not path.is_file():  # a hub id: the copy in the local cache, if any (never a download)
            from huggingface_hub import try_to_load_from_cache
            from huggingface_hub.errors import HFValidationError

            try:
                cached = try_to_load_from_cache(str(model_dir), "preprocessor_config.json")
            except HFValidationError:  # neither a folder nor a hub id
                cached = None
            path = Path(cached) if isinstance(cached, str) else path
        try:
            rate = json.loads(path.read_text()).get("sampling_rate")
            if isinstance(rate, int) and rate > 0:
                return rate
        except (OSError, ValueError, AttributeError):
            pass
    return DEFAULT_AUDIO_RATE


def mono(samples: Any) -> np.ndarray:
    """float32 mono: a 2-D array's channels (its shorter axis: ``[S, C]`` as soundfile reads, ``[C, S]`` as
    librosa and PyAV's planar frames) averaged."""
    arr = np.asarray(samples, dtype=np.float32)
    if arr.ndim == 2:
        arr = arr.mean(axis=int(arr.shape[0] > arr.shape[1]), dtype=np.float32)
    return arr.reshape(-1)


def resample(samples: Any, rate: int | float, target: int | float) -> np.ndarray:
    """float32 mono at ``target``: unchanged when the rates agree, else soxr's HQ filter, once."""
    arr = mono(samples)
    if int(rate) == int(target):
        return arr
    import soxr

    return soxr.resample(arr, int(rate), int(target), quality="HQ").astype(np.float32, copy=False)


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """A 32-bit float WAV of float32 mono samples: read back bit for bit (libsndfile, FFmpeg), no requantizing."""
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.asarray(samples, dtype=np.float32), int(rate), format="WAV", subtype="FLOAT")
    return buf.getvalue()


def rgb_image(image: Any, mode: str = "RGB") -> Any:
    """An RGB ``PIL.Image``: the first frame, EXIF orientation applied, then ``convert("RGB")`` (alpha
    dropped, palette / CMYK / 16-bit / 1-bit mapped by PIL), as diffusers' ``load_image``. ``mode="RGBA"``
    keeps the alpha instead, for a model that reads it (an image without one gets an opaque alpha)."""
    from PIL import ImageOps

    if getattr(image, "n_frames", 1) > 1 and image.tell() != 0:
        image.seek(0)
    image = ImageOps.exif_transpose(image)  # a copy of the current frame; rotated when EXIF says so
    return image if image.mode == mode else image.convert(mode)


def png_bytes(image: Any) -> bytes:
    """Lossless PNG of an RGB image, the form an llm stage's loader reads back pixel for pixel (fast
    compression: it is decoded again at once)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
