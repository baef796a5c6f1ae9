"""The GLM-Image adapter's prior upsampling against diffusers' own (private) helper, the reference."""

from __future__ import annotations

import pytest
import torch

from omnistage.models.glm_image.adapter import upsample_prior


@pytest.mark.parametrize("h,w", [(1, 1), (2, 3), (5, 2), (32, 32)])
def test_upsample_prior_equals_diffusers(h, w):
    from diffusers import GlmImagePipeline

    ids = torch.randint(0, 16512, (h * w,), generator=torch.Generator().manual_seed(h * 100 + w))
    expected = GlmImagePipeline._upsample_token_ids(ids, h, w)
    got = upsample_prior(ids, h, w)
    assert got.dtype == expected.dtype and torch.equal(got, expected)
