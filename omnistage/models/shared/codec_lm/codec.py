"""Codecs for codec_tts: decode codes [B, K, T] -> audio [B, T * samples_per_frame], and encode a
reference clip -> codes [K, T] (voice cloning).

Two kinds, and what streaming means for each:

- **Mimi** is causal end to end (causal convolutions, a causal transposed-conv
  upsampler, a sliding-window causal transformer): the audio of frames
  ``s..e`` depends only on codes up to ``e`` and at most ``receptive_frames``
  before ``s``. Decoding ``[s - C, e)`` and keeping ``[s, e)`` equals the
  whole-sequence decode up to float rounding, and right padding several
  requests into one batch leaves every real sample unchanged.
- **XCodec2** (Llasa's codec) is not causal anywhere that matters: its decoder's
  GroupNorm layers take statistics over the whole time axis, its transformer
  attends over every frame with no mask, and the ISTFT head overlaps two frames
  each side. Every output sample depends on every code, so a streamed decode
  (each block decoded with ``left`` frames before it and ``lookahead`` after)
  is an approximation of the whole decode, and padding changes real samples
  (batches hold windows of one length only). See the decoder for the block
  schedule and docs/families/codec_tts.md for the measured difference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.media_intake import mono, resample

SUPPORTED = ("mimi", "xcodec2")


class MimiCodec:
    causal = True  # streaming with left context only is exact; right padding never reaches real samples

    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import MimiModel

        self.model = MimiModel.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        cfg = self.model.config
        self.device = device
        self.sample_rate = int(cfg.sampling_rate)
        self.num_quantizers = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)
        self.samples_per_frame = int(round(cfg.sampling_rate / cfg.frame_rate))
        self.receptive_frames: int | None = mimi_receptive_frames(cfg)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> float32 audio [B, T * samples_per_frame] (first channel)."""
        audio = self.model.decode(codes.to(self.device)).audio_values
        return audio[:, 0, : codes.shape[-1] * self.samples_per_frame].float().cpu()

    @torch.no_grad()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """Mono float32 audio at ``sample_rate`` -> codes [K, frames]."""
        values = torch.as_tensor(audio, dtype=torch.float32).view(1, 1, -1).to(self.device)
        codes = self.model.encode(values, num_quantizers=self.num_quantizers).audio_codes
        return codes[0].long().cpu()


class Xcodec2Codec:
    causal = False  # every sample depends on every code (GroupNorm over time, unmasked attention)

    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import Xcodec2Model

        self.model = Xcodec2Model.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        cfg = self.model.config
        self.device = device
        self.sample_rate = int(cfg.sampling_rate)
        self.num_quantizers = 1  # one FSQ codebook
        self.codebook_size = int(np.prod(cfg.quantization_levels))
        self.samples_per_frame = int(cfg.hop_length)
        self.receptive_frames = None  # unbounded

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 1, T] -> float32 audio [B, T * samples_per_frame]. Rows must not be padded."""
        audio = self.model.decode(audio_codes=codes.to(self.device)).audio_values
        return audio[:, 0, : codes.shape[-1] * self.samples_per_frame].float().cpu()

    @torch.no_grad()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """Mono float32 audio at ``sample_rate`` -> codes [1, frames] (``Xcodec2Model.encode``)."""
        values, features, mask = self.features(np.asarray(audio, dtype=np.float32))
        out = self.model.encode(
            values.to(self.device), features.to(self.device), input_features_mask=mask.to(self.device)
        )
        return out.audio_codes[0].long().cpu()

    def features(self, audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What ``Xcodec2FeatureExtractor`` computes for one clip: the waveform padded to whole frames, and
        the per-bin normalised, stride-stacked Kaldi log-mel fbank of it (padded by half a frame each side).
        That class needs torchaudio's Kaldi fbank (no build for this torch on PyPI); the fbank here is
        ``SeamlessM4TFeatureExtractor``'s numpy Kaldi fbank, the front end XCodec2 was trained with."""
        from transformers import SeamlessM4TFeatureExtractor

        hop = self.samples_per_frame
        audio = np.pad(audio, (0, 1))  # as the feature extractor: one sample, then whole frames
        audio = np.pad(audio, (0, -len(audio) % hop))
        fe = SeamlessM4TFeatureExtractor(sampling_rate=self.sample_rate, padding_value=1.0)
        out = fe(np.pad(audio, (hop // 2, hop // 2)), sampling_rate=self.sample_rate, return_tensors="pt")
        return torch.from_numpy(audio).view(1, 1, -1), out["input_features"].float(), out["attention_mask"]


def mimi_receptive_frames(cfg) -> int:
    """How many earlier code frames can change the audio of a frame (a safe upper bound).

    Each layer's look-back in its own input steps, converted to code frames by the
    number of steps per frame at that layer's rate, summed over the decode path.
    """
    per_frame = cfg.encodec_frame_rate / cfg.frame_rate  # transformer steps per code frame
    up_kernel = 2 * int(per_frame)
    frames = math.ceil((up_kernel - 1) / per_frame)  # upsampler: transposed conv, stride per_frame
    frames += cfg.num_hidden_layers * cfg.sliding_window / per_frame  # each attention layer looks back a window
    rate = per_frame  # decoder steps per code frame
    frames += (cfg.kernel_size - 1) / rate
    for ratio in cfg.upsampling_ratios:
        frames += math.ceil((2 * ratio - 1) / ratio) / rate  # transposed conv, kernel 2*ratio
        rate *= ratio
        for j in range(cfg.num_residual_layers):
            frames += (cfg.residual_kernel_size - 1) * cfg.dilation_growth_rate**j / rate
    frames += (cfg.last_kernel_size - 1) / rate
    return math.ceil(frames) + 1


def mono_clip(value: Any, field_name: str, rate: int) -> np.ndarray:
    """A request's reference clip ``(samples, sample_rate)`` -> mono float32 at ``rate`` (400 naming the field)."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise InvalidRequestError(field_name, "expected (samples, sample_rate)")
    samples, sr = value
    audio = np.asarray(samples, dtype=np.float32)
    if audio.ndim == 2:  # (samples, channels) or (channels, samples) -> mono, as every other input
        audio = mono(audio)
    if audio.ndim != 1 or audio.size == 0 or isinstance(sr, bool) or not isinstance(sr, int) or sr <= 0:
        raise InvalidRequestError(field_name, "expected non-empty mono samples and a positive integer sample rate")
    if not np.isfinite(audio).all():
        raise InvalidRequestError(field_name, "samples must be finite")
    return resample(audio, sr, rate)  # the one media intake: soxr HQ, once, unchanged at the codec's own rate


def codec_type(folder: Path) -> str:
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{folder}: no codec config.json (expected a transformers codec folder)")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(
            f"{config}: model_type {model_type!r} is not a supported codec (supported: {', '.join(SUPPORTED)})"
        )
    return model_type


def load_codec(folder: Path, device: str = "cpu") -> MimiCodec | Xcodec2Codec:
    return {"mimi": MimiCodec, "xcodec2": Xcodec2Codec}[codec_type(folder)](folder, device)
