"""XTTS v2's speaker encoder (the HiFi-GAN decoder's global conditioning): a 16 kHz clip -> pre-emphasis ->
64-band log mel -> instance norm -> a squeeze-and-excitation ResNet (3, 4, 6, 3 blocks) -> attentive
statistics pooling -> a 512-d L2-normalised embedding.

Written from the model's description in coqui-tts 0.28.0 (``ResNetSpeakerEncoder``, H/ASP); parameter and
buffer names are the checkpoint's (``hifigan_decoder.speaker_encoder.*``): the STFT window and the mel filter
bank are read from it too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SPEAKER_RATE = 16000
N_FFT, WIN, HOP, MELS = 512, 400, 160, 64
FILTERS, BLOCKS = [32, 64, 128, 256], [3, 4, 6, 3]
EMBED_DIM = 512


class PreEmphasis(nn.Module):
    def __init__(self, coefficient: float = 0.97):
        super().__init__()
        self.register_buffer("filter", torch.tensor([[[-coefficient, 1.0]]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T]
        return F.conv1d(F.pad(x.unsqueeze(1), (1, 0), "reflect"), self.filter).squeeze(1)


class _Window(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("window", torch.hamming_window(WIN))


class _Bank(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("fb", torch.zeros(N_FFT // 2 + 1, MELS))


class SpeakerMel(nn.Module):
    """Power mel spectrogram; its window and filter bank are checkpoint buffers (``spectrogram.window``,
    ``mel_scale.fb``)."""

    def __init__(self):
        super().__init__()
        self.spectrogram = _Window()
        self.mel_scale = _Bank()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(
            x,
            N_FFT,
            hop_length=HOP,
            win_length=WIN,
            window=self.spectrogram.window,
            center=True,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        power = spec.abs().pow(2.0)
        return torch.matmul(power.transpose(-1, -2), self.mel_scale.fb).transpose(-1, -2)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 8):
        super().__init__()
        self.fc = nn.Sequential(
            nn.Linear(channels, channels // reduction),
            nn.ReLU(),
            nn.Linear(channels // reduction, channels),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.fc(x.mean(dim=(2, 3))).unsqueeze(-1).unsqueeze(-1)


class SEBlock(nn.Module):
    """conv -> ReLU -> BN -> conv -> BN -> squeeze-excite, plus the (projected) input, ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.se = SqueezeExcite(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn1(F.relu(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class SpeakerEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.torch_spec = nn.Sequential(PreEmphasis(), SpeakerMel())
        self.instancenorm = nn.InstanceNorm1d(MELS)
        self.conv1 = nn.Conv2d(1, FILTERS[0], 3, padding=1)
        self.bn1 = nn.BatchNorm2d(FILTERS[0])
        cin = FILTERS[0]
        for i, (cout, n) in enumerate(zip(FILTERS, BLOCKS)):
            stride = 1 if i == 0 else 2
            blocks = [SEBlock(cin, cout, stride)] + [SEBlock(cout, cout, 1) for _ in range(n - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            cin = cout
        pooled = FILTERS[-1] * (MELS // 8)
        self.attention = nn.Sequential(
            nn.Conv1d(pooled, 128, 1), nn.ReLU(), nn.BatchNorm1d(128), nn.Conv1d(128, pooled, 1), nn.Softmax(dim=2)
        )
        self.fc = nn.Linear(pooled * 2, EMBED_DIM)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        """A mono clip [1, T] at 16 kHz -> [1, 512, 1] (L2-normalised)."""
        x = (self.torch_spec(audio) + 1e-6).log()
        x = self.instancenorm(x).unsqueeze(1)
        x = self.bn1(F.relu(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        w = self.attention(x)
        mu = torch.sum(x * w, dim=2)
        sg = torch.sqrt((torch.sum((x**2) * w, dim=2) - mu**2).clamp(min=1e-5))
        emb = self.fc(torch.cat((mu, sg), 1))
        return F.normalize(emb, p=2, dim=1).unsqueeze(-1)
