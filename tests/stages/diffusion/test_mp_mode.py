"""``process: mp`` runs the diffusion engine in a child process: results identical to inline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import Omni


@pytest.fixture(scope="module")
def sd3(tiny_model):
    return str(tiny_model("sd3"))


@pytest.mark.slow
def test_mp_mode_gives_the_inline_results(sd3):
    params = [{"num_inference_steps": 3, "guidance_scale": 4.0, "height": 32, "width": 32, "seed": 5}]
    prompts = ["a red cat", {"prompt": "green square", "negative_prompt": "blurry"}]
    results = {}
    for mode in ("inline", "mp"):
        with Omni(model=sd3, stage_overrides={"0": {"process": mode, "engine_output_type": "image,latent"}}) as omni:
            # one at a time: batch composition (and so float batch variance) is then the same in both modes
            images = [omni.generate(p, params, use_tqdm=False)[0] for p in prompts]
            latent = omni.generate("a red cat", [{**params[0], "output_type": "latent"}], use_tqdm=False)
            with pytest.raises(ValueError, match="height"):
                omni.generate("a red cat", [{"height": 30}], use_tqdm=False)
        results[mode] = (images, latent)
    (img_i, lat_i), (img_m, lat_m) = results["inline"], results["mp"]
    for a, b in zip(img_i, img_m):
        assert a.error is None and b.error is None
        assert np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))
    assert isinstance(lat_m[0].latents, torch.Tensor)
    assert torch.equal(lat_i[0].latents, lat_m[0].latents)
