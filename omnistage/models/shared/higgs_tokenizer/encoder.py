"""Higgs Audio v2's audio tokenizer, encode side: a reference clip (mono, 24 kHz) -> codes [N, frames], as
``HiggsAudioV2TokenizerModel.encode`` computes them, from the checkpoint's ``audio_tokenizer/`` weights.

transformers' class imports torchaudio for one call, ``torchaudio.functional.resample`` (24 kHz -> the
semantic model's 16 kHz, its default windowed-sinc filter); torchaudio has no build for this torch, so
``resample`` below computes that filter itself. The rest is transformers' own modules (HuBERT, the DAC
encoder) and the tokenizer's small semantic encoder and residual VQ, written out here.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn


def resample(wav: torch.Tensor, orig: int, new: int, zeros: int = 6, rolloff: float = 0.99) -> torch.Tensor:
    """Band-limited resampling of ``wav`` [..., T] by a Hann-windowed sinc of ``zeros`` zero crossings with its
    cutoff at ``rolloff`` of the lower Nyquist rate: one polyphase filter per output phase, applied as a
    strided convolution (torchaudio's default ``sinc_interp_hann`` method, the reference's resampler)."""
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * rolloff
    width = math.ceil(zeros * orig / base)
    dt = wav.dtype  # the filter is computed in the audio's precision, as the reference computes it
    idx = torch.arange(-width, width + orig, dtype=dt)[None, None] / orig
    phase = torch.arange(0, -new, -1, dtype=dt)[:, None, None] / new
    t = (phase + idx) * base
    t = t.clamp(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    t = t * math.pi
    kernel = torch.where(t == 0, torch.ones_like(t), t.sin() / t)
    kernel *= window * (base / orig)
    shape = wav.shape
    x = torch.nn.functional.pad(wav.reshape(-1, shape[-1]), (width, width + orig))
    out = torch.nn.functional.conv1d(x[:, None], kernel, stride=orig)
    out = out.transpose(1, 2).reshape(x.shape[0], -1)[:, : math.ceil(new * shape[-1] / orig)]
    return out.view(*shape[:-1], -1)


class _ResidualUnit(nn.Module):
    def __init__(self, channels: int, kernel: int, dilation: int):
        super().__init__()
        self.conv1 = nn.Conv1d(
            channels, channels, kernel, padding=(kernel - 1) // 2 * dilation, dilation=dilation, bias=False
        )
        self.conv2 = nn.Conv1d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(nn.functional.elu(self.conv1(nn.functional.elu(x))))


class _SemanticBlock(nn.Module):
    def __init__(self, cfg, channels: int, out_channels: int, stride: int):
        super().__init__()
        self.res_units = nn.ModuleList(_ResidualUnit(channels, cfg.unit_kernel_size, d) for d in cfg.block_dilations)
        kernel = 3 if stride == 1 else 2 * stride
        self.conv = nn.Conv1d(channels, out_channels, kernel, stride=stride, padding=(kernel - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class _SemanticEncoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        s = cfg.semantic_hidden_size
        self.conv = nn.Conv1d(s, s, cfg.kernel_size, padding=cfg.kernel_size // 2, bias=False)
        blocks, channels = [], s
        for ratio, stride in zip(cfg.channel_ratios, cfg.strides):
            blocks.append(_SemanticBlock(cfg, channels, int(s * ratio), stride))
            channels = int(s * ratio)
        self.conv_blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x


class HiggsAudioEncoder:
    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoConfig, DacModel, HubertModel
        from transformers.audio_utils import conv1d_output_length

        from omnistage.models.shared.checkpoint import read_tensors

        cfg = AutoConfig.from_pretrained(str(folder))
        self.cfg = cfg
        self.semantic_model = HubertModel(cfg.semantic_model_config)
        self.semantic_model.load_state_dict(read_tensors(folder, "semantic_model."), strict=True)
        self.semantic_encoder = _SemanticEncoder(cfg)
        self.semantic_encoder.load_state_dict(read_tensors(folder, "encoder_semantic."), strict=True)
        self.acoustic = DacModel(cfg.acoustic_model_config).encoder
        self.acoustic.load_state_dict(read_tensors(folder, "acoustic_encoder."), strict=True)
        self.fc = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.fc.load_state_dict(read_tensors(folder, "fc."), strict=True)
        q = read_tensors(folder, "quantizer.quantizers.")
        self.embed = [q[f"{i}.codebook.embed"] for i in range(cfg.num_quantizers)]
        self.project_in, self.project_out = [], []
        for i in range(cfg.num_quantizers):
            pin, pout = nn.Linear(cfg.hidden_size, cfg.codebook_dim), nn.Linear(cfg.codebook_dim, cfg.hidden_size)
            pin.load_state_dict({"weight": q[f"{i}.project_in.weight"], "bias": q[f"{i}.project_in.bias"]})
            pout.load_state_dict({"weight": q[f"{i}.project_out.weight"], "bias": q[f"{i}.project_out.bias"]})
            self.project_in.append(pin.to(device, dtype))
            self.project_out.append(pout.to(device, dtype))
        self.embed = [e.to(device, dtype) for e in self.embed]
        for m in (self.semantic_model, self.semantic_encoder, self.acoustic, self.fc):
            m.to(device, dtype).eval()
        convs = [m for m in self.acoustic.modules() if isinstance(m, nn.Conv1d)]
        self._acoustic_length = lambda n: _through(convs, n, conv1d_output_length)
        self.device, self.dtype = device, dtype
        self.sample_rate = int(cfg.sample_rate)
        self.pad = cfg.hop_length // 2

    @torch.no_grad()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """Mono float32 audio at ``sample_rate`` -> codes [N, frames]."""
        cfg = self.cfg
        wav = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).to(self.device, self.dtype).view(1, 1, -1)
        x = (
            wav
            if cfg.sample_rate == cfg.semantic_sample_rate
            else resample(wav, cfg.sample_rate, cfg.semantic_sample_rate)
        )
        x = nn.functional.pad(x[:, 0], (160, 160))  # the reference's padding of the 16 kHz input
        hidden = self.semantic_model(x, output_hidden_states=True).hidden_states
        semantic = torch.stack(hidden, dim=1).mean(dim=1)[:, :: max(1, cfg.semantic_downsample_factor)]
        semantic = self.semantic_encoder(semantic.transpose(1, 2))
        if self._acoustic_length(wav.shape[2]) != semantic.shape[2]:
            wav = nn.functional.pad(wav, (self.pad, self.pad))
        emb = torch.cat([self.acoustic(wav), semantic], dim=1)
        residual = self.fc(emb.transpose(1, 2))  # [1, T, H]
        codes = []
        for embed, pin, pout in zip(self.embed, self.project_in, self.project_out):
            h = pin(residual).reshape(-1, embed.shape[1])
            dist = -(h.pow(2).sum(1, keepdim=True) - 2 * h @ embed.t() + embed.t().pow(2).sum(0, keepdim=True))
            idx = dist.max(dim=-1).indices
            codes.append(idx)
            residual = residual - pout(embed[idx]).view_as(residual)
        return torch.stack(codes).cpu()


def _through(convs, n: int, length) -> int:
    for conv in convs:
        n = length(conv, n)
    return n
