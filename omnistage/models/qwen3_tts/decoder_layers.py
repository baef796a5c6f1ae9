"""The building blocks of the 12 Hz speech tokenizer's decoder (``speech_decoder.py`` assembles them): causal
(transposed) convolutions, SnakeBeta, ConvNeXt, the RMSNorm / SwiGLU / layer-scale transformer with causal
sliding-window attention, and the split RVQ. Attribute names are the ``qwen-tts`` package's, so the published
weights load strictly."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.shared.layers import GatedMlp, RMSNorm


class CausalConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.padding = self.span - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        frames = math.ceil((n - self.span + self.padding) / self.stride + 1)
        extra = (frames - 1) * self.stride + (self.span - self.padding) - n  # whole strides at the end
        return self.conv(F.pad(x, (self.padding, extra)))


class CausalTransConv(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim] if self.trim > 0 else y


class SnakeBeta(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))  # log scale
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXt(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + h.transpose(1, 2)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        h, d = cfg["hidden_size"], cfg["head_dim"]
        self.heads, self.kv_heads, self.head_dim = cfg["num_attention_heads"], cfg["num_key_value_heads"], d
        bias = bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(h, self.heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """(output, the keys/values attended: ``past``'s rotated keys/values, then this input's)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        rep = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), attn_mask=mask
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.self_attn = Attention(cfg)
        self.mlp = GatedMlp(h, cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn_layer_scale = LayerScale(h)
        self.mlp_layer_scale = LayerScale(h)

    def forward(self, x, cos, sin, mask, past=None):
        attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + self.self_attn_layer_scale(attn)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x))), kv


class Transformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"speech tokenizer decoder: hidden_act {cfg['hidden_act']!r} is not supported (silu)")
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.input_proj = nn.Linear(cfg["latent_dim"], cfg["hidden_size"])
        self.output_proj = nn.Linear(cfg["hidden_size"], cfg["latent_dim"])
        self.window = int(cfg["sliding_window"])
        d = cfg["head_dim"]
        self.register_buffer(
            "inv_freq",
            1.0 / (float(cfg.get("rope_theta", 10000)) ** (torch.arange(0, d, 2).float() / d)),
            persistent=False,
        )

    def forward(self, x: torch.Tensor, state: dict[str, Any] | None = None) -> torch.Tensor:
        """x [B, T, latent] -> [B, T, latent]. With ``state`` (one row), x continues the frames it has seen:
        the keys/values of each layer's last ``window - 1`` frames are kept there, so a stream of pieces
        computes what one forward over all of them does."""
        t = x.shape[1]
        start = state.get("pos", 0) if state is not None else 0
        past = state.get("kv") if state is not None else None
        cached = past[0][0].shape[2] if past else 0
        pos = torch.arange(start, start + t, device=x.device).float()
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        qi = torch.arange(start, start + t, device=x.device)[:, None]
        kj = torch.arange(start - cached, start + t, device=x.device)[None, :]
        mask = (kj <= qi) & (qi - kj < self.window)  # causal, the last `window` frames
        h = self.input_proj(x)
        kept = []
        for i, layer in enumerate(self.layers):
            h, (k, v) = layer(h, cos, sin, mask, past[i] if past else None)
            kept.append((k[:, :, -(self.window - 1) :], v[:, :, -(self.window - 1) :]))
        if state is not None:
            state["pos"], state["kv"] = start + t, kept
        return self.output_proj(self.norm(h))


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        table = self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]
        return F.embedding(codes, table)


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))


class RVQ(nn.Module):
    """One residual quantizer group's decode: sum of its codebooks' vectors, projected out (``input_proj`` is
    the encoder side's, loaded and unused)."""

    def __init__(self, n: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.input_proj = nn.Conv1d(out_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)
        self.vq = _Layers(n, size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # codes [B, n, T] -> [B, out_dim, T]
        total = sum(layer._codebook.decode(codes[:, i]) for i, layer in enumerate(self.vq.layers))
        return self.output_proj(total.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, groups: int, size: int, codebook_dim: int):
        super().__init__()
        self.rvq_first = RVQ(1, size, codebook_dim // 2, codebook_dim)
        self.rvq_rest = RVQ(groups - 1, size, codebook_dim // 2, codebook_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList(
            [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate), *(ResidualUnit(cout, d) for d in (1, 3, 9))]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x
