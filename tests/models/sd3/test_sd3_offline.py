"""Offline use end to end: Omni(model=dir).generate and ``omnistage generate``, against diffusers."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from omnistage import Omni
from omnistage.cli.main import main as cli_main
from tests.stages.diffusion.helpers import gen, tiny_family

sd3, _, ref = tiny_family("sd3", reference="StableDiffusion3Pipeline", folder="sd3")


def test_omni_generate_returns_pil_images_equal_to_diffusers(sd3, ref):
    kw = dict(num_inference_steps=4, guidance_scale=5.0, height=32, width=32)
    with Omni(model=sd3) as omni:
        assert omni.pipeline.name == "sd3"
        solo = omni.generate("a red cat", [{**kw, "seed": 7}], use_tqdm=False)
        outs = omni.generate(
            ["a red cat", {"prompt": "green square", "negative_prompt": "blurry"}], [{**kw, "seed": 7}], use_tqdm=False
        )
        with pytest.raises(ValueError, match="height"):
            omni.generate("a red cat", [{"height": 33}], use_tqdm=False)
    assert [len(o.images) for o in outs] == [1, 1]
    assert isinstance(outs[0].images[0], Image.Image)
    assert outs[0].metrics[0]["num_steps"] == 4
    want0 = ref("a red cat", generator=gen(7), **kw).images[0]
    want1 = ref("green square", negative_prompt="blurry", generator=gen(7), **kw).images[0]
    assert np.array_equal(np.asarray(solo[0].images[0]), np.asarray(want0))
    # batched together: float batch variance may move a pixel by one uint8 level at most
    for got, want in ((outs[0], want0), (outs[1], want1)):
        diff = np.abs(np.asarray(got.images[0]).astype(int) - np.asarray(want).astype(int))
        assert diff.max() <= 1


def test_cli_generate_refuses_a_key_the_family_does_not_declare(sd3, tmp_path, capsys):
    """Offline, an extra-body key the family does not declare is an error naming it (over HTTP: a warning)."""
    out = tmp_path / "cat.png"
    rc = cli_main(["generate", sd3, "--prompt", "a red cat", "--extra-body", '{"not_a_knob": 1}', "--output", str(out)])
    assert rc != 0
    assert "not_a_knob" in capsys.readouterr().err
    assert not out.exists()


def test_cli_generate_writes_the_image_with_a_progress_bar(sd3, ref, tmp_path, capsys):
    out = tmp_path / "cat.png"
    rc = cli_main(
        [
            "generate",
            sd3,
            "--prompt",
            "a red cat",
            "--num-inference-steps",
            "3",
            "--height",
            "32",
            "--width",
            "32",
            "--seed",
            "5",
            "--guidance-scale",
            "4",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    assert "steps 3/3" in capsys.readouterr().err  # tqdm's step postfix
    want = ref("a red cat", generator=gen(5), num_inference_steps=3, guidance_scale=4.0, height=32, width=32).images[0]
    assert np.array_equal(np.asarray(Image.open(out)), np.asarray(want))

    src = tmp_path / "in.png"
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(src)
    edited = tmp_path / "edit.png"
    assert (
        cli_main(
            [
                "generate",
                sd3,
                "--prompt",
                "a red cat",
                "--image",
                str(src),
                "--strength",
                "0.6",
                "--num-inference-steps",
                "5",
                "--height",
                "32",
                "--width",
                "32",
                "--output",
                str(edited),
            ]
        )
        == 0
    )
    assert Image.open(edited).size == (32, 32)
    assert cli_main(["generate", sd3, "--prompt", "x", "--height", "30", "--output", str(tmp_path / "bad.png")]) == 2
    assert "height" in capsys.readouterr().err
