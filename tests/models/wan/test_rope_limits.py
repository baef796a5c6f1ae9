"""Wan's rotary table covers ``rope_max_seq_len`` patches per axis: frames, height and width beyond it are
refused by the adapter's validation (naming the field) rather than failing inside the DiT. The boundary is
checked against diffusers' own ``WanRotaryPosEmbed``."""

from __future__ import annotations

import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.wan import PIPELINE, WanAdapter
from tests.stages.diffusion.helpers import run, start_engine, tiny_family

wan, adapter, _ = tiny_family("wan", WanAdapter, folder="wan")


def limits(adapter: WanAdapter) -> dict[str, tuple[int, int]]:
    """field -> (largest allowed value, the next value the family's own rules allow)."""
    most = adapter.pipe.transformer.config.rope_max_seq_len
    f, ft = adapter.pipe.vae_scale_factor_spatial, adapter.pipe.vae_scale_factor_temporal
    side = most * f * adapter.patch[1]
    frames = (most * adapter.patch[0] - 1) * ft + 1
    return {
        "height": (side, side + f * adapter.patch[1]),
        "width": (side, side + f * adapter.patch[2]),
        "num_frames": (frames, frames + ft),
    }


def test_limits_are_where_diffusers_rope_stops(adapter):
    rope = adapter.pipe.transformer.rope
    f, ft = adapter.pipe.vae_scale_factor_spatial, adapter.pipe.vae_scale_factor_temporal
    lim = limits(adapter)

    def latents(frames: int, height: int, width: int) -> torch.Tensor:
        return torch.zeros(1, adapter.in_channels, (frames - 1) // ft + 1, height // f, width // f)

    top = {k: v[0] for k, v in lim.items()}
    rope(latents(top["num_frames"], 32, 32))
    rope(latents(5, top["height"], top["width"]))
    for field, (_, beyond) in lim.items():
        shape = {"num_frames": 5, "height": 32, "width": 32, field: beyond}
        with pytest.raises(RuntimeError):
            rope(latents(shape["num_frames"], shape["height"], shape["width"]))


async def test_oversize_requests_name_the_field(wan, adapter):
    engine = await start_engine(PIPELINE, adapter, wan)
    try:
        for field, (top, beyond) in limits(adapter).items():
            params = {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 1, field: beyond}
            with pytest.raises(InvalidRequestError, match=f"{beyond} exceeds this model's maximum of {top}") as e:
                await run(engine, f"big-{field}", "a cat", **params)
            assert e.value.field == field
    finally:
        await engine.shutdown()
