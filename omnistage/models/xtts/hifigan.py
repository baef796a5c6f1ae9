"""XTTS v2's waveform decoder: the GPT's latents [T, d] (one per code, 1024 samples of 22.05 kHz audio each)
-> linear interpolation to the vocoder's frame rate at 24 kHz -> a HiFi-GAN generator conditioned on the
speaker embedding before the first and after every upsampling layer -> 24 kHz audio.

Written from the model's description in coqui-tts 0.28.0 (``HifiDecoder``, ``HifiganGenerator``: upsampling
8, 8, 2, 2 from 512 channels; residual blocks of kernel 3, 7, 11 at dilations 1, 3, 5); parameter names are
the checkpoint's (``hifigan_decoder.waveform_decoder.*``, weight-normed layers as torch's parametrizations).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from torch.nn.utils.parametrize import remove_parametrizations

SLOPE = 0.1
UPSAMPLE = [8, 8, 2, 2]
UP_KERNELS = [16, 16, 4, 4]
RES_KERNELS = [3, 7, 11]
RES_DILATIONS = [1, 3, 5]
CHANNELS = 512
CODE_SAMPLES = 1024  # 22.05 kHz samples per GPT code
HOP = 256  # the vocoder's input frame, in 22.05 kHz samples
IN_RATE, OUT_RATE = 22050, 24000


def _conv(ch: int, k: int, d: int) -> nn.Module:
    return weight_norm(nn.Conv1d(ch, ch, k, 1, dilation=d, padding=(k * d - d) // 2))


class ResBlock(nn.Module):
    def __init__(self, ch: int, k: int):
        super().__init__()
        self.convs1 = nn.ModuleList(_conv(ch, k, d) for d in RES_DILATIONS)
        self.convs2 = nn.ModuleList(_conv(ch, k, 1) for _ in RES_DILATIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            x = c2(F.leaky_relu(c1(F.leaky_relu(x, SLOPE)), SLOPE)) + x
        return x


class HifiganGenerator(nn.Module):
    def __init__(self, in_channels: int, cond_channels: int):
        super().__init__()
        self.conv_pre = nn.Conv1d(in_channels, CHANNELS, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            weight_norm(nn.ConvTranspose1d(CHANNELS >> i, CHANNELS >> (i + 1), k, u, padding=(k - u) // 2))
            for i, (u, k) in enumerate(zip(UPSAMPLE, UP_KERNELS))
        )
        self.resblocks = nn.ModuleList(
            ResBlock(CHANNELS >> (i + 1), k) for i in range(len(UPSAMPLE)) for k in RES_KERNELS
        )
        self.conv_post = nn.Conv1d(CHANNELS >> len(UPSAMPLE), 1, 7, 1, padding=3, bias=False)
        self.cond_layer = nn.Conv1d(cond_channels, CHANNELS, 1)
        self.conds = nn.ModuleList(nn.Conv1d(cond_channels, CHANNELS >> (i + 1), 1) for i in range(len(UPSAMPLE)))

    def fold_weight_norm(self) -> None:
        """Compute each weight-normed weight once (the same product the parametrization computes per call)."""
        for m in self.modules():
            if hasattr(m, "parametrizations"):
                remove_parametrizations(m, "weight")

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        o = self.conv_pre(x) + self.cond_layer(g)
        n = len(RES_KERNELS)
        for i, up in enumerate(self.ups):
            o = up(F.leaky_relu(o, SLOPE)) + self.conds[i](g)
            z = self.resblocks[i * n](o)
            for j in range(1, n):
                z += self.resblocks[i * n + j](o)
            o = z / n
        return torch.tanh(self.conv_post(F.leaky_relu(o)))


def vocoder_input(latents: torch.Tensor) -> torch.Tensor:
    """Latents [B, T, d] -> the generator's input [B, d, frames]: 4 frames a code, then 22.05 -> 24 kHz."""
    z = F.interpolate(latents.transpose(1, 2), scale_factor=[CODE_SAMPLES / HOP], mode="linear")
    return F.interpolate(z, scale_factor=[OUT_RATE / IN_RATE], mode="linear")
