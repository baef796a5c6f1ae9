"""VoxCPM2's audio VAE (its ``AudioVAE`` v2), written from the release's arithmetic with its parameter names:
a causal convolutional encoder (16 kHz audio -> latent frames, for a reference clip) and a causal decoder
(latent frames -> audio at the output rate, conditioned on that rate). Weight-normed convolutions keep the
release's ``weight_g`` / ``weight_v`` and compute the weight as its ``weight_norm`` hook does.

Everything is causal, so the audio of frames ``s..e`` depends only on frames up to ``e`` and at most
``receptive_frames`` before ``s``: a streamed block decoded with that much context equals the whole decode.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class WNConv(nn.Module):
    """A weight-normed causal (transposed) 1-D convolution: left padding 2 * pad - output_pad, or that many
    samples cut from the end of a transposed one."""

    def __init__(
        self, cin, cout, kernel, stride=1, dilation=1, groups=1, pad=0, out_pad=0, transposed=False, bias=True
    ):
        super().__init__()
        shape = (cin, cout // groups, kernel) if transposed else (cout, cin // groups, kernel)
        self.weight_v = nn.Parameter(torch.zeros(shape))
        self.weight_g = nn.Parameter(torch.ones(shape[0], 1, 1))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.stride, self.dilation, self.groups, self.transposed = stride, dilation, groups, transposed
        self.causal = 2 * pad - out_pad
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch._weight_norm(self.weight_v, self.weight_g, 0)
        if self.transposed:
            y = F.conv_transpose1d(x, w, self.bias, self.stride, groups=self.groups)
            return y[..., : -self.causal]
        x = F.pad(x, (self.causal, 0))
        return F.conv1d(x, w, self.bias, self.stride, dilation=self.dilation, groups=self.groups)


class Snake(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        pad = 6 * dilation // 2
        self.block = nn.Sequential(
            Snake(dim), WNConv(dim, dim, 7, dilation=dilation, groups=groups, pad=pad), Snake(dim), WNConv(dim, dim, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


def _units(dim: int, groups: int) -> list[nn.Module]:
    return [ResidualUnit(dim, d, groups) for d in (1, 3, 9)]


class EncoderBlock(nn.Module):
    def __init__(self, out_dim: int, stride: int, groups: int):
        super().__init__()
        d = out_dim // 2
        down = WNConv(d, out_dim, 2 * stride, stride=stride, pad=math.ceil(stride / 2), out_pad=stride % 2)
        self.block = nn.Sequential(*_units(d, groups), Snake(d), down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, stride: int, groups: int):
        super().__init__()
        up = WNConv(in_dim, out_dim, 2 * stride, stride, pad=math.ceil(stride / 2), out_pad=stride % 2, transposed=True)
        self.block = nn.Sequential(Snake(in_dim), up, *_units(out_dim, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, d_model: int, latent: int, rates: list[int], depthwise: bool):
        super().__init__()
        blocks: list[nn.Module] = [WNConv(1, d_model, 7, pad=3)]
        for stride in rates:
            d_model *= 2
            blocks.append(EncoderBlock(d_model, stride, d_model // 2 if depthwise else 1))
        self.block = nn.Sequential(*blocks)
        self.fc_mu = WNConv(d_model, latent, 3, pad=1)
        self.fc_logvar = WNConv(d_model, latent, 3, pad=1)  # (training only; kept so every key loads)


class RateCondition(nn.Module):
    """Per-channel scale and bias picked by the output rate's bucket (``scale_bias`` / ``scale_bias_init``)."""

    def __init__(self, dim: int, buckets: int):
        super().__init__()
        self.scale_embed = nn.Embedding(buckets, dim)
        self.bias_embed = nn.Embedding(buckets, dim)

    def forward(self, x: torch.Tensor, bucket: torch.Tensor) -> torch.Tensor:
        return x * self.scale_embed(bucket).unsqueeze(-1) + self.bias_embed(bucket).unsqueeze(-1)


class Decoder(nn.Module):
    def __init__(self, latent: int, channels: int, rates: list[int], depthwise: bool, boundaries: list[int] | None):
        super().__init__()
        first = [WNConv(latent, latent, 7, groups=latent, pad=3), WNConv(latent, channels, 1)] if depthwise else []
        layers: list[nn.Module] = first or [WNConv(latent, channels, 7, pad=3)]
        out = channels
        for i, stride in enumerate(rates):
            out = channels // 2 ** (i + 1)
            layers.append(DecoderBlock(channels // 2**i, out, stride, out if depthwise else 1))
        layers += [Snake(out), WNConv(out, 1, 7, pad=3), nn.Tanh()]
        self.model = nn.ModuleList(layers)
        self.sr_cond_model = None
        if boundaries is not None:
            self.register_buffer("sr_bin_boundaries", torch.tensor(boundaries, dtype=torch.int32))
            conds = [
                RateCondition(m.block[0].alpha.shape[1], len(boundaries) + 1) if isinstance(m, DecoderBlock) else None
                for m in layers
            ]
            self.sr_cond_model = nn.ModuleList(conds)

    def forward(self, z: torch.Tensor, rate: int) -> torch.Tensor:
        bucket = None
        if self.sr_cond_model is not None:
            bucket = torch.bucketize(torch.tensor([rate], dtype=torch.int32), self.sr_bin_boundaries)
        for i, layer in enumerate(self.model):
            if bucket is not None and self.sr_cond_model[i] is not None:
                z = self.sr_cond_model[i](z, bucket)
            z = layer(z)
        return z


def receptive_frames(decoder: Decoder) -> int:
    """Latent frames before a block that its audio can depend on (walked from the output back: a causal conv
    adds its left padding, a transposed conv of stride s maps a lag of n samples to ceil(n / s) + 1 inputs)."""
    lag = 0
    convs = [m for m in decoder.modules() if isinstance(m, WNConv)]
    for conv in reversed(convs):
        lag = math.ceil(lag / conv.stride) + 1 if conv.transposed else lag + (conv.kernel - 1) * conv.dilation
    return lag + 1


class AudioVAE(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        if cfg.get("use_noise_block") or cfg.get("cond_type", "scale_bias") not in ("scale_bias", "scale_bias_init"):
            raise ValueError(
                "voxcpm: this audio VAE config (noise blocks, or a rate condition other than scale/bias) is not supported"
            )
        if cfg.get("cond_out_layer"):
            raise ValueError("voxcpm: an audio VAE with cond_out_layer is not supported")
        depthwise = cfg.get("depthwise", True)
        self.encoder = Encoder(cfg["encoder_dim"], cfg["latent_dim"], cfg["encoder_rates"], depthwise)
        self.decoder = Decoder(
            cfg["latent_dim"], cfg["decoder_dim"], cfg["decoder_rates"], depthwise, cfg.get("sr_bin_boundaries")
        )
        self.latent_dim = cfg["latent_dim"]
        self.sample_rate = cfg["sample_rate"]  # the encoder's input rate
        self.out_sample_rate = cfg.get("out_sample_rate") or cfg["sample_rate"]
        self.chunk_size = math.prod(cfg["encoder_rates"])  # input samples per latent frame
        self.decode_chunk_size = math.prod(cfg["decoder_rates"])  # output samples per latent frame
        self.receptive_frames = receptive_frames(self.decoder)

    @torch.no_grad()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """audio [B, N] at ``sample_rate`` (N a multiple of ``chunk_size``) -> latents [B, D, N / chunk_size]."""
        return self.encoder.fc_mu(self.encoder.block(audio.unsqueeze(1)))

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """latents [B, D, T] -> audio [B, T * decode_chunk_size] at ``out_sample_rate``."""
        return self.decoder(z, self.out_sample_rate)[:, 0]
