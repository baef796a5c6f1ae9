"""Flux's latent layout, which Ovis-Image and LongCat-Image share: 2x2 latent patches packed into tokens, and the
tokens' 3-axis position ids."""

from __future__ import annotations

import torch


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/2)*(W/2), 4C]: FLUX's 2x2 patch tokens, channels fastest within a patch."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse of ``pack`` for a latent grid of ``h`` x ``w``."""
    b, _, d = tokens.shape
    x = tokens.view(b, h // 2, w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, d // 4, h, w)


def position_ids(h: int, w: int, first: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """RoPE ids of a packed ``h`` x ``w`` token grid: (first, row, column) per token, row-major."""
    ids = torch.zeros(h, w, 3)
    ids[..., 0] = first
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3).to(device=device, dtype=dtype)
