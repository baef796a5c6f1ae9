"""The Base checkpoints' voice-clone front end: a reference clip -> its speech-tokenizer codes (in-context
cloning) and its x-vector (the speaker embedding the talker's prompt carries).

- Codes: the 12 Hz tokenizer's encoder is transformers' ``MimiModel`` without its decoder (weights
  ``encoder.*`` of ``speech_tokenizer/model.safetensors``; older transformers name its SEANet encoder
  ``encoder.layers``, newer ``encoder.encoder_seanet.layers``: both load), keeping the first
  ``encoder_valid_num_quantizers`` codebooks and ``ceil(samples / 1920)`` frames, as ``qwen-tts`` does.
- X-vector: ECAPA-TDNN over a 128-bin log-mel spectrogram (``speaker_encoder.*`` of ``model.safetensors``),
  re-implemented here because it exists only in the ``qwen-tts`` package; the mel filters are
  transformers' Slaney-scale bank (librosa's ``filters.mel`` defaults, which the package uses).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.shared.checkpoint import read_tensors


class MimiEncoder:
    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import MimiConfig, MimiModel

        cfg = json.loads((folder / "config.json").read_text())
        self.model = MimiModel(MimiConfig(**cfg["encoder_config"]))
        expected = set(self.model.state_dict())
        weights = {}
        for k, v in read_tensors(folder, "encoder.").items():
            if k not in expected and k.startswith("encoder.layers."):  # transformers' later SEANet naming
                k = k.replace("encoder.layers.", "encoder.encoder_seanet.layers.", 1)
            weights[k] = v
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        missing = [k for k in missing if not k.startswith(("decoder.", "decoder_transformer.", "upsample."))]
        if missing or unexpected:
            raise ValueError(
                f"{folder}: speech tokenizer encoder weights: missing {missing[:4]}, unexpected {unexpected[:4]}"
            )
        self.model = self.model.to(device=device, dtype=dtype).eval()
        self.device, self.dtype = device, dtype
        self.valid = int(cfg["encoder_valid_num_quantizers"])
        self.downsample = int(cfg.get("encode_downsample_rate", 1920))
        self.sample_rate = int(cfg.get("input_sample_rate", 24000))

    @torch.no_grad()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """Mono float32 audio at ``sample_rate`` -> codes [frames, G]."""
        values = torch.as_tensor(audio, dtype=self.dtype, device=self.device).view(1, 1, -1)
        codes = self.model.encode(values).audio_codes[0, : self.valid]  # [G, T]
        return codes[:, : math.ceil(audio.shape[-1] / self.downsample)].T.long().cpu()


# ---------------------------------------------------------------------------------------- ECAPA-TDNN


def _conv(cin: int, cout: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class Tdnn(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            Tdnn(channels // scale, channels // scale, kernel, dilation) for _ in range(scale - 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(torch.chunk(x, self.scale, dim=1))
        out = [parts[0]]
        for i in range(1, self.scale):
            out.append(self.blocks[i - 1](parts[i] if i == 1 else parts[i] + out[-1]))
        return torch.cat(out, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, se: int):
        super().__init__()
        self.conv1 = _conv(channels, se, 1)
        self.conv2 = _conv(se, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = Tdnn(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = Tdnn(cout, cout, 1, 1)
        self.se_block = SqueezeExcite(cout, se)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    def __init__(self, channels: int, attention: int):
        super().__init__()
        self.tdnn = Tdnn(channels * 3, attention, 1, 1)
        self.conv = _conv(attention, channels, 1)

    @staticmethod
    def _stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        mean, std = self._stats(x, torch.full_like(x[:, :1], 1.0 / t))  # global context: uniform weights
        context = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], dim=1)
        w = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, w)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        ch, ks, dil = cfg["enc_channels"], cfg["enc_kernel_sizes"], cfg["enc_dilations"]
        if not len(ch) == len(ks) == len(dil):
            raise ValueError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations differ in length"
            )
        self.blocks = nn.ModuleList([Tdnn(cfg["mel_dim"], ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(
                SERes2NetBlock(ch[i - 1], ch[i], cfg["enc_res2net_scale"], cfg["enc_se_channels"], ks[i], dil[i])
            )
        self.mfa = Tdnn(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg["enc_attention_channels"])
        self.fc = _conv(ch[-1] * 2, cfg["enc_dim"], 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels [B, T, mel_dim] -> x-vectors [B, enc_dim]."""
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)


class XVectorExtractor:
    N_FFT, HOP, WIN, MELS = 1024, 256, 1024, 128

    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers.audio_utils import mel_filter_bank

        cfg = json.loads((folder / "config.json").read_text())["speaker_encoder_config"]
        self.sample_rate = int(cfg.get("sample_rate", 24000))
        self.model = SpeakerEncoder(cfg)
        self.model.load_state_dict(read_tensors(folder, "speaker_encoder."), strict=True)
        self.model = self.model.to(device=device, dtype=dtype).eval()
        self.device, self.dtype = device, dtype
        bank = mel_filter_bank(
            num_frequency_bins=self.N_FFT // 2 + 1,
            num_mel_filters=self.MELS,
            min_frequency=0.0,
            max_frequency=self.sample_rate / 2,
            sampling_rate=self.sample_rate,
            norm="slaney",
            mel_scale="slaney",
        )
        self.mel_basis = torch.from_numpy(bank.T.astype(np.float32))  # [mels, bins]

    def mels(self, audio: np.ndarray) -> torch.Tensor:
        """log-mel [1, frames, 128]: reflect-padded, uncentred Hann STFT magnitudes, log(clamp(., 1e-5))."""
        y = torch.as_tensor(audio, dtype=torch.float32).view(1, 1, -1)
        pad = (self.N_FFT - self.HOP) // 2
        y = F.pad(y, (pad, pad), mode="reflect").view(1, -1)
        spec = torch.stft(
            y,
            self.N_FFT,
            hop_length=self.HOP,
            win_length=self.WIN,
            window=torch.hann_window(self.WIN),
            center=False,
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
        return torch.log(torch.clamp(self.mel_basis @ mag, min=1e-5)).transpose(1, 2)

    @torch.no_grad()
    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        """Mono float32 audio at ``sample_rate`` -> x-vector [enc_dim]."""
        return self.model(self.mels(audio).to(self.device, self.dtype))[0]
