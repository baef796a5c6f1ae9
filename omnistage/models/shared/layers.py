"""Small torch layers that several families' own ports of a reference model use unchanged (the Qwen3-TTS speech
decoder, VoxCPM2's MiniCPM-4 LM, GLM-Image's vLLM model): parameter names as the checkpoints store them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, the weight applied in the input's dtype (transformers'
    Llama / Qwen2 ``RMSNorm``)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class GatedMlp(nn.Module):
    """The SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, size: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(size, inner, bias=False)
        self.up_proj = nn.Linear(size, inner, bias=False)
        self.down_proj = nn.Linear(inner, size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
