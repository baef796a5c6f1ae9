"""``omnistage generate`` (a real subprocess, as a user runs it) on the tiny FLUX.1-Kontext and Z-Image folders:
the written PNGs equal diffusers' own ``__call__`` within one uint8 level."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

pytestmark = pytest.mark.slow


def generate(*args: str) -> list[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "generate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def close(path: str, want: Image.Image) -> bool:
    got, want = np.asarray(Image.open(path).convert("RGB")).astype(int), np.asarray(want).astype(int)
    return got.shape == want.shape and int(np.abs(got - want).max()) <= 1


def test_kontext_edit(tiny_model, tmp_path):
    from diffusers import FluxKontextPipeline

    folder = str(tiny_model("flux_kontext"))
    src = Image.fromarray(np.random.default_rng(1).integers(0, 255, (48, 32, 3), dtype=np.uint8))
    src.save(tmp_path / "in.png")
    (path,) = generate(
        folder,
        "--prompt",
        "make it red",
        "--image",
        str(tmp_path / "in.png"),
        "--height",
        "32",
        "--width",
        "48",
        "--num-inference-steps",
        "2",
        "--seed",
        "4",
        "--guidance-scale",
        "3.0",
        "--extra-body",
        json.dumps({"max_area": 48 * 32, "auto_resize": False}),
        "--output",
        str(tmp_path / "out.png"),
    )
    torch.set_num_threads(1)
    pipe = FluxKontextPipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        image=src,
        prompt="make it red",
        height=32,
        width=48,
        num_inference_steps=2,
        guidance_scale=3.0,
        max_area=48 * 32,
        _auto_resize=False,
        generator=torch.Generator().manual_seed(4),
    ).images[0]
    assert close(path, want)


def test_z_image_two_outputs(tiny_model, tmp_path):
    from diffusers import ZImagePipeline

    folder = str(tiny_model("z_image"))
    paths = generate(
        folder,
        "--prompt",
        "a bowl of fruit",
        "--height",
        "32",
        "--width",
        "32",
        "-n",
        "2",
        "--num-inference-steps",
        "3",
        "--seed",
        "2",
        "--output",
        str(tmp_path / "z.png"),
    )
    torch.set_num_threads(1)
    pipe = ZImagePipeline.from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    want = pipe(
        "a bowl of fruit",
        height=32,
        width=32,
        num_inference_steps=3,
        guidance_scale=0.0,
        num_images_per_prompt=2,
        generator=torch.Generator().manual_seed(2),
    ).images
    assert len(paths) == 2 and all(close(p, w) for p, w in zip(paths, want))
