"""``omnistage generate`` with no model, as a user runs it (a subprocess): it ends as soon as the PNG is written
(os._exit, skipping the interpreter's slow teardown of torch / diffusers), with exit code 0, and the PNG is the
picture the same request gives through ``Omni`` in this process."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from PIL import Image

PROMPT = "a small blue triangle in the center"


def test_generate_writes_what_omni_gives(tmp_path):
    from omnistage import Omni

    out = tmp_path / "out.png"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnistage.cli.main",
            "generate",
            "--prompt",
            PROMPT,
            "--seed",
            "3",
            "--num-inference-steps",
            "4",
            "--output",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(out)]
    assert "warning:" not in done.stderr  # words and a size it draws
    with Omni(model=None) as omni:
        (want,) = omni.generate([{"prompt": PROMPT}], [{"seed": 3, "num_inference_steps": 4}])
    assert np.array_equal(np.asarray(Image.open(out).convert("RGB")), np.asarray(want.images[0].convert("RGB")))

    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnistage.cli.main",
            "generate",
            "--prompt",
            PROMPT,
            "--height",
            "30",
            "--output",
            str(tmp_path / "bad.png"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "height" in bad.stderr  # the exit code still says what happened


def test_generate_says_what_it_cannot_draw(tmp_path):
    """A shape colour named as the background and a size the demo was not trained at: the picture is still
    written, and stderr says why it will not look like the prompt, as the server's warnings do."""
    out = tmp_path / "out.png"
    done = subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "generate", "--prompt", "a red circle on a yellow background"]
        + ["--height", "128", "--width", "128", "--num-inference-steps", "1", "--output", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(out)] and Image.open(out).size == (128, 128)
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, done.stderr[-3000:]
    assert "'yellow background'" in warnings[0] and "backgrounds are black, white, gray, brown" in warnings[0]
    assert "at 128x128" in warnings[1] and "Ask for size 64x64" in warnings[1]
