"""Wan image-to-video on the diffusion engine vs diffusers' WanImageToVideoPipeline (fp32, CPU)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.models.wan import PIPELINE, WanAdapter
from omnistage.models.wan.adapter import WanI2VAdapter
from omnistage.models.wan.tiny import build_i2v
from tests.stages.diffusion.helpers import finished_data, gen, latent, max_diff, reference_pipeline, run, start_engine

KW = dict(height=32, width=48, num_frames=5, num_inference_steps=3, guidance_scale=4.0)


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-wan-i2v")
    build_i2v(folder)
    return str(folder)


@pytest.fixture(scope="module")
def adapter(i2v):
    adapter = WanAdapter.load(i2v, torch.float32, torch.device("cpu"))  # the family entry point picks I2V
    assert isinstance(adapter, WanI2VAdapter)
    return adapter


@pytest.fixture(scope="module")
def ref(i2v):
    return reference_pipeline("WanImageToVideoPipeline", i2v)


def _image(seed: int, size=(40, 24)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def test_family_resolves_from_the_folder(i2v):
    from omnistage.pipeline import resolve_pipeline

    assert resolve_pipeline(i2v).name == "wan"


async def test_solo_equals_diffusers_and_batched_within_tolerance(i2v, adapter, ref):
    engine = await start_engine(PIPELINE, adapter, i2v)
    try:
        image = _image(0)
        mm = {"multi_modal_data": {"image": image}}
        outs = await run(engine, "a", "a red cat", inputs=mm, seed=2, output_type="latent", **KW)
        want = ref(image, "a red cat", generator=gen(2), output_type="latent", **KW).frames
        assert max_diff(latent(outs), want) == 0.0

        outs = await run(engine, "b", "a red cat", inputs={**mm, "negative_prompt": "blurry"}, seed=2, **KW)
        want = ref(image, "a red cat", negative_prompt="blurry", generator=gen(2), **KW).frames
        assert np.array_equal(finished_data(outs)["video"], (want[0] * 255).round().astype(np.uint8))

        # two requests with other images, seeds and guidance share forwards
        specs = [("c", 0, 3, 5.0), ("d", 1, 4, 1.0)]
        solo = {}
        for rid, img, seed, g in specs:
            o = await run(
                engine,
                rid + "-solo",
                "green square",
                inputs={"multi_modal_data": {"image": _image(img)}},
                seed=seed,
                output_type="latent",
                **{**KW, "guidance_scale": g},
            )
            solo[rid] = latent(o)
        engine.forward_log.clear()
        results = await asyncio.gather(
            *[
                run(
                    engine,
                    rid,
                    "green square",
                    inputs={"multi_modal_data": {"image": _image(img)}},
                    seed=seed,
                    output_type="latent",
                    **{**KW, "guidance_scale": g},
                )
                for rid, img, seed, g in specs
            ]
        )
        assert any(len(ids) == 2 for _, ids in engine.forward_log)
        for (rid, *_), outs in zip(specs, results):
            assert max_diff(latent(outs), solo[rid]) <= 1e-5, rid
    finally:
        await engine.shutdown()


@pytest.mark.parametrize(
    "params,inputs,field",
    [
        ({}, {}, "multi_modal_data.image"),
        ({}, {"multi_modal_data": {"image": [_image(0), _image(1)]}}, "multi_modal_data.image"),
        (dict(strength=0.5), {"multi_modal_data": {"image": _image(0)}}, "strength"),
        (dict(max_sequence_length=64), {"multi_modal_data": {"image": _image(0)}}, "max_sequence_length"),
    ],
)
async def test_bad_inputs_name_the_field(i2v, adapter, params, inputs, field):
    engine = await start_engine(PIPELINE, adapter, i2v)
    try:
        with pytest.raises(ValueError, match=field):
            await run(engine, "bad", "a red cat", inputs=inputs, **{**KW, **params})
    finally:
        await engine.shutdown()


def test_videos_route_with_input_reference(i2v, ref, tmp_path):
    """POST /v1/videos/sync with an uploaded first frame (in-process server): the MP4 decodes to what diffusers'
    frames for the same image and seed encode to."""
    import io

    import av

    from omnistage import AsyncOmni
    from omnistage.config.settings import ServerSettings
    from omnistage.server.media import encode_mp4
    from omnistage.testing.server import serve_engine

    def decode(data: bytes) -> np.ndarray:
        with av.open(io.BytesIO(data)) as container:
            return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])

    buf = io.BytesIO()
    _image(7).save(buf, format="PNG")
    srv = serve_engine(AsyncOmni(model=i2v), ServerSettings(storage={"path": str(tmp_path)}))
    try:
        with srv.client() as c:
            form = {
                "prompt": "a red cat",
                "size": "48x32",
                "num_frames": "5",
                "num_inference_steps": "3",
                "guidance_scale": "4.0",
                "seed": "6",
                "fps": "8",
            }
            r = c.post("/v1/videos/sync", data=form, files={"input_reference": ("f.png", buf.getvalue(), "image/png")})
            assert r.status_code == 200, r.text
            want = ref(_image(7), "a red cat", generator=gen(6), **KW).frames[0]
            assert np.array_equal(decode(r.content), decode(encode_mp4((want * 255).round().astype(np.uint8), 8)))
    finally:
        srv.stop()
