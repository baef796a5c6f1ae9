"""VoxCPM2's small per-patch modules, written from the release's arithmetic with its parameter names: the local
encoder (a patch of latents -> one LM input), the scalar quantiser on the LM's hidden states, and the local
diffusion transformer with its Euler flow-matching sampler (classifier-free guidance, CFG-zero*).

The sampler runs every live request of an engine step in one batch: row i draws its start noise from its own
generator (the numbers the release draws from the global generator after ``torch.manual_seed``), and has its
own guidance scale; all rows share the number of timesteps (the caller groups rows by it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from omnistage.models.voxcpm.layers import MiniCPM


def sub_config(lm: dict[str, Any], part: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    """The LM config with a sub-model's sizes (the release copies the LM's and overrides these)."""
    cfg = dict(lm)
    if part is not None:
        cfg.update(
            hidden_size=part["hidden_dim"],
            intermediate_size=part["ffn_dim"],
            num_attention_heads=part["num_heads"],
            num_hidden_layers=part["num_layers"],
            kv_channels=part.get("kv_channels"),
            vocab_size=0,
        )
    cfg.update(over)
    return cfg


class LocalEncoder(nn.Module):
    """A patch [P, D] -> one vector: a learned special token in front, bidirectional attention, its output."""

    def __init__(self, cfg: dict[str, Any], feat_dim: int):
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, cfg["hidden_size"]))
        self.in_proj = nn.Linear(feat_dim, cfg["hidden_size"])
        self.encoder = MiniCPM(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, P, D] -> [B, T, H]."""
        b, t, p, _ = x.shape
        x = self.in_proj(x)
        x = torch.cat([self.special_token.expand(b, t, 1, -1), x], dim=2).reshape(b * t, p + 1, -1)
        out, _ = self.encoder(x, causal=False)
        return out[:, 0].reshape(b, t, -1)


class ScalarQuantizer(nn.Module):
    def __init__(self, dim: int, latent: int, scale: int):
        super().__init__()
        self.in_proj = nn.Linear(dim, latent)
        self.out_proj = nn.Linear(latent, dim)
        self.scale = scale

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.round(torch.tanh(self.in_proj(h)) * self.scale) / self.scale)


class TimeMLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(torch.nn.functional.silu(self.linear_1(x)))


def sinusoidal(x: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=x.dtype, device=x.device) * -(math.log(10000) / (half - 1)))
    emb = scale * x.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class LocalDiT(nn.Module):
    """The velocity of a patch x [N, D, P] given the LM's condition mu [N, 2 * H], the time t [N], the previous
    patch cond [N, D, P'] and dt [N] (zero: the release does not use mean-velocity mode at inference)."""

    def __init__(self, cfg: dict[str, Any], feat_dim: int):
        super().__init__()
        h = cfg["hidden_size"]
        self.in_proj = nn.Linear(feat_dim, h)
        self.cond_proj = nn.Linear(feat_dim, h)
        self.out_proj = nn.Linear(h, feat_dim)
        self.time_mlp = TimeMLP(h)
        self.delta_time_mlp = TimeMLP(h)
        self.decoder = MiniCPM(cfg)
        self.hidden = h

    def forward(self, x, mu, t, cond, dt):
        x = self.in_proj(x.transpose(1, 2).contiguous())
        cond = self.cond_proj(cond.transpose(1, 2).contiguous())
        temb = self.time_mlp(sinusoidal(t, self.hidden).to(x.dtype))
        temb = temb + self.delta_time_mlp(sinusoidal(dt, self.hidden).to(x.dtype))
        mu = mu.view(x.shape[0], -1, x.shape[-1])
        h, _ = self.decoder(torch.cat([mu, temb.unsqueeze(1), cond, x], dim=1), causal=False)
        return self.out_proj(h[:, cond.shape[1] + mu.shape[1] + 1 :]).transpose(1, 2).contiguous()


class FlowSampler(nn.Module):
    """The release's ``UnifiedCFM`` at inference (its module name ``feat_decoder``; the DiT is ``estimator``)."""

    def __init__(self, cfg: dict[str, Any], feat_dim: int, mean_mode: bool):
        super().__init__()
        self.estimator = LocalDiT(cfg, feat_dim)
        self.mean_mode = mean_mode  # the DiT also sees the step size (else dt is zero)

    @torch.no_grad()
    def forward(self, mu, cond, noise, steps: int, cfg_value: torch.Tensor, sway: float = 1.0) -> torch.Tensor:
        """mu [B, 2H], cond [B, D, P], noise [B, D, P] (already scaled by temperature), cfg_value [B] -> [B, D, P]."""
        t_span = torch.linspace(1, 0, steps + 1, dtype=mu.dtype)
        t_span = t_span + sway * (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)
        x, b = noise, noise.shape[0]
        t, dt = t_span[0], t_span[0] - t_span[1]
        zero_init = max(1, int(len(t_span) * 0.04))  # CFG-zero*: the first steps move nothing
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        cond_in = torch.cat([cond, cond])
        for s in range(1, len(t_span)):
            if s <= zero_init:
                v = torch.zeros_like(x)
            else:
                t_in = t.expand(2 * b).contiguous()
                dt_in = dt.expand(2 * b).contiguous() if self.mean_mode else torch.zeros_like(t_in)
                out = self.estimator(torch.cat([x, x]), mu_in, t_in, cond_in, dt_in)
                pos, neg = out[:b], out[b:]
                st = (pos.reshape(b, -1) * neg.reshape(b, -1)).sum(1, keepdim=True)
                st = (st / ((neg.reshape(b, -1) ** 2).sum(1, keepdim=True) + 1e-8)).view(b, 1, 1)
                v = neg * st + cfg_value.view(b, 1, 1) * (pos - neg * st)
            x = x - dt * v
            t = t - dt
            if s < len(t_span) - 1:
                dt = t - t_span[s + 1]
        return x
