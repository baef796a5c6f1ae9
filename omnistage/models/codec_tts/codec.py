"""Codec decoders for codec_tts: codes [B, K, T] -> audio [B, T * samples_per_frame].

Streaming without changing the result: Mimi's decoder is causal end to end
(causal convolutions, a causal transposed-conv upsampler, a sliding-window
causal transformer), so the audio of frames ``s..e`` depends only on codes up
to ``e`` and at most ``context_frames`` before ``s``. Decoding ``[s - C, e)``
and keeping the samples of ``[s, e)`` therefore equals the whole-sequence
decode (up to float rounding) when ``C`` covers the receptive field, and
right-padding several requests' windows into one batch leaves every real
sample unchanged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

SUPPORTED = ("mimi",)


class MimiCodec:
    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import MimiModel

        self.model = MimiModel.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        cfg = self.model.config
        self.device = device
        self.sample_rate = int(cfg.sampling_rate)
        self.num_quantizers = int(cfg.num_quantizers)
        self.codebook_size = int(cfg.codebook_size)
        self.samples_per_frame = int(round(cfg.sampling_rate / cfg.frame_rate))
        self.receptive_frames = mimi_receptive_frames(cfg)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> float32 audio [B, T * samples_per_frame] (first channel)."""
        audio = self.model.decode(codes.to(self.device)).audio_values
        return audio[:, 0, : codes.shape[-1] * self.samples_per_frame].float().cpu()


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
            frames += (cfg.residual_kernel_size - 1) * cfg.dilation_growth_rate ** j / rate
    frames += (cfg.last_kernel_size - 1) / rate
    return math.ceil(frames) + 1


def load_codec(folder: Path, device: str = "cpu") -> MimiCodec:
    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{folder}: no codec config.json (expected a transformers codec folder)")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(f"{config}: model_type {model_type!r} is not a supported codec (supported: {', '.join(SUPPORTED)})")
    return MimiCodec(folder, device)
