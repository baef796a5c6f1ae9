"""Qwen-Image over HTTP with the official openai client: ``images.edit`` with several uploaded images on an
-Edit-2509/-2511 style checkpoint; the same edit through ``omnistage generate`` with repeated ``--image``
(``images.generate`` is the family's row in tests/e2e/test_image_families_http.py). The PNGs must equal diffusers' own ``__call__`` for the same
seed within one uint8 level; bad requests are 400s naming the field.

The servers are ``omnistage serve``'s app on uvicorn in a thread of this process (omnistage.testing.server);
``omnistage generate`` runs as a subprocess, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import openai
import pytest
from PIL import Image

from omnistage import AsyncOmni
from tests.image_http import decode, png
from tests.models.qwen_image.common import gen, image, reference

pytestmark = pytest.mark.slow  # each edit VAE-encodes ~1 Mpx per input image, in the server and the reference


def assert_close(got: np.ndarray, want: Image.Image) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == np.uint8
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


@pytest.fixture(scope="module")
def t2i(family_server):
    return family_server("qwen_image")  # the harness's server (served as tiny-qwen_image)


@pytest.fixture(scope="module")
def plus(tiny_model, server_factory):
    folder = tiny_model("qwen_image_edit_plus")
    srv = server_factory(AsyncOmni(model=str(folder)), served_model_name="tiny-qwen-edit")
    return folder, openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)


# one multi-image edit, sent over HTTP and through the CLI
EDIT_PROMPT = "put them on a beach"
EDIT_KW = dict(negative_prompt=" ", true_cfg_scale=2.5, height=64, width=64, num_inference_steps=2)
EDIT_SEED = 4


def edit_sources() -> list[Image.Image]:
    return [image(40, 60, 1), image(50, 30, 2)]


@pytest.fixture(scope="module")
def edit_reference(plus) -> Image.Image:
    folder, _ = plus
    ref = reference("QwenImageEditPlusPipeline", folder)
    return ref(image=edit_sources(), prompt=EDIT_PROMPT, generator=gen(EDIT_SEED), **EDIT_KW).images[0]


def test_edit_with_several_images_equals_diffusers_call(plus, edit_reference):
    _, client = plus
    files = [(f"in{i}.png", png(im), "image/png") for i, im in enumerate(edit_sources())]
    body = {k: v for k, v in EDIT_KW.items() if k not in ("height", "width")}
    resp = client.images.edit(
        model="tiny-qwen-edit", image=files, prompt=EDIT_PROMPT, size="64x64", extra_body={**body, "seed": EDIT_SEED}
    )
    assert len(resp.data) == 1
    assert_close(decode(resp.data[0].b64_json), edit_reference)


def test_cli_generate_with_several_images(plus, edit_reference, tmp_path):
    folder, _ = plus
    paths = []
    for i, im in enumerate(edit_sources()):
        paths += ["--image", str(tmp_path / f"in{i}.png")]
        im.save(paths[-1])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnistage.cli.main",
            "generate",
            str(folder),
            "--prompt",
            EDIT_PROMPT,
            *paths,
            "--negative-prompt",
            " ",
            "--true-cfg-scale",
            "2.5",
            "--height",
            "64",
            "--width",
            "64",
            "--num-inference-steps",
            "2",
            "--seed",
            str(EDIT_SEED),
            "--output",
            str(tmp_path / "out.png"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(tmp_path / "out.png")]
    assert_close(np.asarray(Image.open(tmp_path / "out.png").convert("RGB")), edit_reference)


def _error(exc: pytest.ExceptionInfo) -> dict:
    assert exc.value.status_code == 400
    return exc.value.body


def test_bad_requests_are_400s_naming_the_field(t2i, plus):
    _, gen_client = t2i
    _, edit_client = plus
    small = png(image(32, 32))
    with pytest.raises(openai.BadRequestError) as e:  # not a multiple of 16
        gen_client.images.generate(model="tiny-qwen_image", prompt="a cat", size="40x40")
    assert _error(e)["param"] == "size"  # the field sent (the stage checks the height it gives)
    with pytest.raises(openai.BadRequestError) as e:  # an edit to the text-to-image checkpoint
        gen_client.images.edit(
            model="tiny-qwen_image", image=("a.png", small, "image/png"), prompt="a cat", size="32x32"
        )
    assert _error(e)["param"] == "image"
    with pytest.raises(openai.BadRequestError) as e:  # four input images: -2509/-2511 take 1-3
        edit_client.images.edit(
            model="tiny-qwen-edit",
            image=[(f"{i}.png", small, "image/png") for i in range(4)],
            prompt="a cat",
            size="64x64",
        )
    assert _error(e)["param"] == "image"
    with pytest.raises(openai.BadRequestError) as e:  # an edit checkpoint without an input image
        edit_client.images.generate(model="tiny-qwen-edit", prompt="a cat", size="64x64")
    assert _error(e)["param"] == "image"


def test_true_cfg_scale_without_a_negative_prompt_runs_as_diffusers_does(t2i):
    # vLLM-Omni's text-to-image client sends true_cfg_scale 4.0 and no negative prompt: diffusers then runs no true
    # CFG (and logs a warning); so does omnistage, with the warning in the answer
    folder, client = t2i
    kw = dict(true_cfg_scale=4.0, num_inference_steps=2, seed=6)
    raw = client.images.with_raw_response.generate(model="tiny-qwen_image", prompt="a cat", size="48x32", extra_body=kw)
    resp = raw.parse()
    assert any("true_cfg_scale=4" in w for w in raw.headers.get_list("x-omnistage-warning"))
    want = reference("QwenImagePipeline", folder)(
        prompt="a cat", height=32, width=48, true_cfg_scale=4.0, num_inference_steps=2, generator=gen(6)
    ).images[0]
    assert_close(decode(resp.data[0].b64_json), want)
