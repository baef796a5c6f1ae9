"""VoxCPM2's transformer (MiniCPM-4: RMSNorm, LongRoPE, grouped-query attention, SwiGLU, muP residual scaling)
written from the release's arithmetic, with its parameter names, so its checkpoints load as they are.

One module serves four roles: the text-semantic LM and the residual acoustic LM (causal, a KV cache per
request), the local encoder and the local DiT (bidirectional over a few positions). ``forward`` runs whole
sequences (returning each layer's keys/values for a prefill); ``step`` runs one new position per row over a
``stages.ar.kv.StepCache`` (rows at different lengths, one padded batch).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.shared.layers import GatedMlp, RMSNorm

KV_BLOCK = 16


def lm_dims(cfg: dict[str, Any]) -> tuple[int, int, int]:
    """(heads, kv heads, head dim) of a MiniCPM-4 config dict."""
    heads = cfg["num_attention_heads"]
    return heads, cfg["num_key_value_heads"], cfg.get("kv_channels") or cfg["hidden_size"] // heads


def long_rope_tables(cfg: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max positions, head dim] of MiniCPM's LongRoPE (float32, scaled as the release scales them)."""
    dim = lm_dims(cfg)[2]
    scaling = cfg["rope_scaling"]
    n, orig = cfg["max_position_embeddings"], scaling["original_max_position_embeddings"]
    factor = math.sqrt(1 + math.log(n / orig) / math.log(orig))
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim))
    ext = torch.tensor(scaling["long_factor"] if n > orig else scaling["short_factor"], dtype=torch.float32)
    freqs = torch.mul(torch.outer(torch.arange(n, dtype=torch.float32), 1.0 / ext), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * factor, emb.sin() * factor


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    x = x.to(torch.float32)
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = lm_dims(cfg)
        h = cfg["hidden_size"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)

    def qkv(self, x: torch.Tensor, pos: tuple[torch.Tensor, torch.Tensor] | None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if pos is not None:
            q, k = rope(q, *pos), rope(k, *pos)
        return q.contiguous(), k.contiguous(), v.contiguous()

    def out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))

    def forward(self, x, pos, causal: bool):
        q, k, v = self.qkv(x, pos)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return self.out(o), (k, v)

    def step(self, x, pos, cache, layer: int, mask: torch.Tensor):
        q, k, v = self.qkv(x, pos)
        keys, values = cache.update(k, v, layer)
        pad = mask.shape[-1] - keys.shape[2]  # (step() pads the mask to whole blocks)
        keys, values = F.pad(keys, (0, 0, 0, pad)), F.pad(values, (0, 0, 0, pad))
        o = F.scaled_dot_product_attention(q, keys.contiguous(), values.contiguous(), attn_mask=mask, enable_gqa=True)
        return self.out(o)


class Layer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = GatedMlp(cfg["hidden_size"], cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        use_mup = cfg.get("use_mup", True)
        self.scale = cfg["scale_depth"] / math.sqrt(cfg["num_hidden_layers"]) if use_mup else None

    def _add(self, residual: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return residual + h * self.scale if self.scale is not None else residual + h

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self._add(x, self.mlp(self.post_attention_layernorm(x)))

    def forward(self, x, pos, causal: bool):
        h, kv = self.self_attn(self.input_layernorm(x), pos, causal)
        return self._mlp(self._add(x, h)), kv

    def step(self, x, pos, cache, layer: int, mask):
        return self._mlp(self._add(x, self.self_attn.step(self.input_layernorm(x), pos, cache, layer, mask)))


class MiniCPM(nn.Module):
    """A stack of layers; ``cfg`` is the release's MiniCPM-4 config dict (with the role's overrides)."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        if cfg["vocab_size"] > 0:
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.has_rope = not cfg.get("no_rope", False)
        if self.has_rope:
            cos, sin = long_rope_tables(cfg)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, causal: bool) -> tuple[torch.Tensor, list]:
        pos = None
        if self.has_rope:
            idx = torch.arange(x.shape[1], device=x.device)
            pos = (self.cos[idx], self.sin[idx])
        kvs = []
        for layer in self.layers:
            x, kv = layer(x, pos, causal)
            kvs.append(kv)
        return self.norm(x), kvs

    def step(self, x: torch.Tensor, cache) -> torch.Tensor:
        """x [B, H]: one new position per row (row i at ``cache.starts[i]``) -> [B, H]."""
        pos = None
        if self.has_rope:
            idx = torch.tensor(cache.starts, device=x.device)
            pos = (self.cos[idx][:, None, None], self.sin[idx][:, None, None])
        # Keys padded (masked out) to a multiple of KV_BLOCK: torch's CPU attention kernel then sums in the same
        # order as over the release's static 8192-position cache (a 13-key call differs from it by 2.4e-7, a
        # 16-key one not at all), so the steps equal the release's bit for bit instead of drifting a few LSB.
        mask = cache.mask(x.device)
        mask = F.pad(mask, (0, -mask.shape[-1] % KV_BLOCK), value=False)
        h = x[:, None]
        for i, layer in enumerate(self.layers):
            h = layer.step(h, pos, cache, i, mask)
        cache.commit()
        return self.norm(h)[:, 0]
