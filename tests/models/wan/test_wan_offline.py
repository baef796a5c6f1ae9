"""Offline use of the wan family: Omni / AsyncOmni on the tiny folder return videos equal to WanPipeline's."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage import AsyncOmni, Omni
from omnistage.testing.streams import all_outputs, final_output
from tests.stages.diffusion.helpers import gen, tiny_family

KW = dict(num_inference_steps=3, guidance_scale=5.0, height=32, width=48, num_frames=5, max_sequence_length=16)


wan, _, ref = tiny_family("wan", reference="WanPipeline", folder="wan")


def _want(ref, prompt, seed, **kw):
    return (ref(prompt, generator=gen(seed), **{**KW, **kw}).frames[0] * 255).round().astype(np.uint8)


def test_omni_generate_returns_the_video(wan, ref):
    with Omni(model=wan) as omni:
        assert omni.pipeline.name == "wan"
        assert omni.default_sampling_params_list[0]["fps"] == 16
        [out] = omni.generate({"prompt": "a red cat", "negative_prompt": "blurry"}, [{**KW, "seed": 7}], use_tqdm=False)
    assert out.final_output_type == "video" and out.modalities == ["video"]
    assert out.video.dtype == np.uint8 and out.video.shape == (5, 32, 48, 3)
    assert out.fps == 16 and out.metrics[0]["num_steps"] == 3
    assert np.array_equal(out.video, _want(ref, "a red cat", 7, negative_prompt="blurry"))


async def test_async_omni_streams_progress_then_the_video(wan, ref):
    async with AsyncOmni(model=wan) as engine:
        outs = await all_outputs(
            engine.generate("green square", request_id="v1", sampling_params_list=[{**KW, "seed": 3, "fps": 8}])
        )
        with pytest.raises(ValueError, match="num_frames"):
            await final_output(
                engine.generate(
                    "green square", request_id="v2", sampling_params_list=[{"num_frames": 129}]
                )  # past the rotary table
            )
    # every denoising step is reported before the video arrives
    steps = [o.progress[0] for o in outs if o.progress is not None]
    assert steps == sorted(steps) and sorted(set(steps)) == [0, 1, 2, 3] and outs[-1].metrics[0]["num_steps"] == 3
    last = outs[-1]
    assert last.finished and last.error is None and last.fps == 8
    assert np.array_equal(last.video, _want(ref, "green square", 3))


@pytest.mark.slow
def test_mp_mode_carries_the_video(wan, ref):
    """``process: mp``: frames and fps cross the process boundary unchanged."""
    with Omni(model=wan, stage_overrides={"0": {"process": "mp"}}) as omni:
        [out] = omni.generate("a red cat", [{**KW, "seed": 9, "fps": 12}], use_tqdm=False)
    assert out.error is None and out.fps == 12
    assert np.array_equal(out.video, _want(ref, "a red cat", 9))


def test_cli_generate_writes_an_mp4(wan, ref, tmp_path):
    import av

    from omnistage.cli.main import main as cli_main
    from omnistage.server.media import encode_mp4

    rc = cli_main(
        [
            "generate",
            wan,
            "--prompt",
            "a red cat",
            "--num-frames",
            "5",
            "--height",
            "32",
            "--width",
            "48",
            "--num-inference-steps",
            "3",
            "--seed",
            "7",
            "--extra-body",
            '{"max_sequence_length": 16}',
            "--output",
            str(tmp_path / "clip.png"),
        ]
    )
    assert rc == 0
    data = (tmp_path / "clip.mp4").read_bytes()  # an image suffix becomes .mp4
    # the same frames, encoded the same way (H.264 is lossy: compare the encodings, then the decoded size)
    assert data == encode_mp4(_want(ref, "a red cat", 7), 16)
    with av.open(str(tmp_path / "clip.mp4")) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 5 and frames[0].shape == (32, 48, 3)
