"""The power mel spectrogram XTTS v2 computes of a reference clip (the release computes it with torchaudio's
``MelSpectrogram``, which has no build for this torch): a centred, reflect-padded STFT's power, times a
triangular HTK-scale filter bank computed in float32 as the release computes it."""

from __future__ import annotations

import math

import torch
from torch import nn


def htk_filter_bank(n_freqs: int, f_max: float, n_mels: int, rate: int, slaney_norm: bool) -> torch.Tensor:
    """[n_freqs, n_mels]: triangles evenly spaced on the HTK mel scale from 0 Hz to ``f_max``; with
    ``slaney_norm`` each triangle is scaled to unit area (2 / its width in Hz)."""
    freqs = torch.linspace(0, rate // 2, n_freqs)
    top = 2595.0 * math.log10(1.0 + f_max / 700.0)
    edges = 700.0 * (10 ** (torch.linspace(0.0, top, n_mels + 2) / 2595.0) - 1.0)
    widths = edges[1:] - edges[:-1]
    offsets = edges.unsqueeze(0) - freqs.unsqueeze(1)
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    bank = torch.max(torch.zeros(1), torch.min(rising, falling))
    if slaney_norm:
        bank = bank * (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels])).unsqueeze(0)
    return bank


class MelSpectrogram(nn.Module):
    def __init__(
        self,
        rate: int,
        n_fft: int,
        win_length: int,
        hop: int,
        n_mels: int,
        f_max: float | None = None,
        norm: str | None = None,
        window: str = "hann",
    ):
        super().__init__()
        self.n_fft, self.win_length, self.hop = n_fft, win_length, hop
        make = torch.hann_window if window == "hann" else torch.hamming_window
        self.register_buffer("window", make(win_length), persistent=False)
        bank = htk_filter_bank(n_fft // 2 + 1, f_max or rate // 2, n_mels, rate, norm == "slaney")
        self.register_buffer("fb", bank, persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, n_mels, frames]
        spec = torch.stft(
            audio,
            self.n_fft,
            hop_length=self.hop,
            win_length=self.win_length,
            window=self.window,
            center=True,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        power = spec.abs().pow(2.0)
        return torch.matmul(power.transpose(-1, -2), self.fb).transpose(-1, -2)
