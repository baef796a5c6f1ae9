"""SD3's positional embedding bounds the image size: a request beyond it is refused by the adapter's
validation (400 naming the field) instead of failing inside the transformer after the work of encoding.
The boundary is checked against diffusers' own ``PatchEmbed``."""

from __future__ import annotations

import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.sd3 import PIPELINE, SD3Adapter
from tests.stages.diffusion.helpers import finished_data, run, start_engine, tiny_family

sd3, adapter, _ = tiny_family("sd3", SD3Adapter, folder="sd3")


def test_max_side_is_where_diffusers_patch_embed_stops(adapter):
    limit, step = adapter.max_side(), adapter.size_multiple()
    f = adapter.pipe.vae_scale_factor
    embed = adapter.pipe.transformer.pos_embed
    embed(torch.zeros(1, 4, limit // f, limit // f))  # the largest allowed size fits diffusers' embedding...
    with pytest.raises(ValueError, match="pos_embed_max_size"):
        embed(torch.zeros(1, 4, (limit + step) // f, limit // f))  # ...one step more does not


@pytest.mark.parametrize("field", ["height", "width"])
async def test_oversize_request_names_the_field_and_the_engine_carries_on(sd3, adapter, field):
    limit, step = adapter.max_side(), adapter.size_multiple()
    engine = await start_engine(PIPELINE, adapter, sd3)
    try:
        with pytest.raises(InvalidRequestError, match=f"{limit + step} exceeds this model's maximum of {limit}") as e:
            await run(
                engine, "big", "a cat", **{"height": 32, "width": 32, field: limit + step, "num_inference_steps": 1}
            )
        assert e.value.field == field
        ok = finished_data(
            await run(engine, "ok", "a cat", height=32, width=32, num_inference_steps=1, output_type="latent", seed=0)
        )
        assert ok  # the engine still serves
    finally:
        await engine.shutdown()
