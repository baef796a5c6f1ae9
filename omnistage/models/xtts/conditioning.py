"""XTTS v2's speaker conditioning of the GPT: a reference clip's mel spectrogram -> the conditioning encoder
(a 1x1 conv and six self-attention blocks over time) -> a perceiver resampler to 32 latents [32, d].

Written from the model's description in coqui-tts 0.28.0 (``Xtts.get_gpt_cond_latents``); parameter names
are the release checkpoint's (``gpt.conditioning_encoder.*``, ``gpt.conditioning_perceiver.*``), so
``model.pth`` loads into these modules as it is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.xtts.audio import MelSpectrogram

PERCEIVER_LATENTS = 32  # the release's fixed perceiver shape (heads, head size and depth alike)
PERCEIVER_HEADS, PERCEIVER_HEAD_DIM, PERCEIVER_DEPTH = 8, 64, 2
COND_BLOCKS = 6
COND_RATE = 22050  # the conditioning encoder's sample rate
MIN_CHUNK_S = 0.33  # a clip chunk shorter than this is skipped, as the release does


def _groups(channels: int) -> int:
    """The release's GroupNorm group count for ``channels`` (32, fewer for narrow layers)."""
    groups = 8 if channels <= 16 else 16 if channels <= 64 else 32
    while channels % groups:
        groups //= 2
    return groups


class SelfAttentionBlock(nn.Module):
    """GroupNorm, multi-head attention over time from one 1x1-conv qkv projection, added to the normed input."""

    def __init__(self, channels: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(_groups(channels), channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T]
        b, c, t = x.shape
        normed = self.norm(x.float()).type(x.dtype)
        qkv = self.qkv(normed).reshape(b * self.heads, -1, t)  # heads first, then q/k/v within each head
        q, k, v = qkv.chunk(3, dim=1)
        scale = 1 / math.sqrt(math.sqrt(q.shape[1]))  # split across q and k, as the release scales
        weights = torch.einsum("bct,bcs->bts", q * scale, k * scale)
        weights = torch.softmax(weights.float(), dim=-1).type(weights.dtype)
        out = torch.einsum("bts,bcs->bct", weights, v).reshape(b, c, t)
        return normed + self.proj_out(out)


class ConditioningEncoder(nn.Module):
    def __init__(self, mels: int, dim: int, heads: int):
        super().__init__()
        self.init = nn.Conv1d(mels, dim, kernel_size=1)
        self.attn = nn.Sequential(*[SelfAttentionBlock(dim, heads) for _ in range(COND_BLOCKS)])

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, mels, T] -> [B, dim, T]
        return self.attn(self.init(mel))


class CrossAttention(nn.Module):
    """The perceiver's attention: the latents query themselves and the context (keys/values over both)."""

    def __init__(self, dim: int):
        super().__init__()
        inner = PERCEIVER_HEADS * PERCEIVER_HEAD_DIM
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        context = torch.cat([latents, context], dim=-2)
        k, v = self.to_kv(context).chunk(2, dim=-1)

        def heads(t: torch.Tensor) -> torch.Tensor:  # [B, N, H*D] -> [B, H, N, D]
            return t.unflatten(-1, (PERCEIVER_HEADS, PERCEIVER_HEAD_DIM)).transpose(1, 2)

        q, k, v = heads(self.to_q(latents)), heads(k), heads(v)
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * PERCEIVER_HEAD_DIM**-0.5
        out = torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)
        return self.to_out(out.transpose(1, 2).flatten(2))


class GatedFeedForward(nn.Sequential):
    """Linear -> GELU-gated half -> linear (indices 0 and 2 hold the weights, as in the checkpoint)."""

    def __init__(self, dim: int, mult: int = 4):
        inner = int(dim * mult * 2 / 3)
        super().__init__(nn.Linear(dim, inner * 2), _GeluGate(), nn.Linear(inner, dim))


class _GeluGate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, gate = x.chunk(2, dim=-1)
        return x * F.gelu(gate)


class ScaledRMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class PerceiverResampler(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.latents = nn.Parameter(torch.zeros(PERCEIVER_LATENTS, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([CrossAttention(dim), GatedFeedForward(dim)]) for _ in range(PERCEIVER_DEPTH)
        )
        self.norm = ScaledRMSNorm(dim)

    def forward(self, context: torch.Tensor) -> torch.Tensor:  # [B, T, dim] -> [B, 32, dim]
        latents = self.latents.expand(context.shape[0], -1, -1)
        for attn, ff in self.layers:
            latents = attn(latents, context) + latents
            latents = ff(latents) + latents
        return self.norm(latents)


class ClipConditioner:
    """A reference clip -> the GPT's conditioning latents, through the GPT's conditioning encoder and
    perceiver (``gpt``: the module holding both) and the checkpoint's mel normalisation (``mel_stats``)."""

    def __init__(self, gpt: nn.Module, mel_stats: torch.Tensor):
        self.gpt, self.mel_stats = gpt, mel_stats
        # the release's cloning mel: 2048-point FFT, hop 256, window 1024, 80 Slaney-normalised HTK bands to 8 kHz
        self.mel = MelSpectrogram(COND_RATE, 2048, 1024, 256, 80, f_max=8000, norm="slaney", window="hann")
        self.mel.to(mel_stats.device)

    def style(self, audio: torch.Tensor) -> torch.Tensor:
        """One chunk [1, T] at 22.05 kHz -> [1, dim, 32]."""
        mel = torch.log(torch.clamp(self.mel(audio), min=1e-5)) / self.mel_stats[None, :, None]
        conds = self.gpt.conditioning_encoder(mel)
        return self.gpt.conditioning_perceiver(conds.permute(0, 2, 1)).transpose(1, 2)

    def __call__(self, audio: torch.Tensor, length_s: float, chunk_s: float) -> torch.Tensor:
        """A mono clip [1, T] at 22.05 kHz -> the GPT's conditioning latents [1, 32, dim]: the mean style of
        its ``chunk_s`` chunks within its first ``length_s`` seconds."""
        if length_s > 0:
            audio = audio[:, : int(COND_RATE * length_s)]
        step = int(COND_RATE * chunk_s)
        styles = [
            self.style(audio[:, i : i + step])
            for i in range(0, audio.shape[1], step)
            if audio[:, i : i + step].shape[-1] >= COND_RATE * MIN_CHUNK_S
        ]
        if not styles:
            raise ValueError(f"the reference clip is shorter than {MIN_CHUNK_S} s")
        return torch.stack(styles).mean(dim=0).transpose(1, 2)
