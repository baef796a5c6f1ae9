"""``omnistage generate FOLDER --video clip.mp4 --output out.mp4`` as a user runs it (a subprocess): inverse dynamics
writes the MP4 and the actions beside it (``out.actions.json``), equal to Cosmos3OmniPipeline's on the same
decoded frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from omnistage.server.media import encode_mp4
from tests.models.cosmos3.test_http import decode_mp4
from tests.stages.diffusion.helpers import gen, tiny_family

pytestmark = pytest.mark.slow  # a subprocess importing torch and diffusers: 20 s or more

STEPS = dict(num_inference_steps=3, guidance_scale=6.0)
TASK = {"task": "inverse_dynamics", "action_domain": "av", "action_chunk_size": 4, "resolution_tier": 256}

cosmos3, _, ref = tiny_family("cosmos3", reference="Cosmos3OmniPipeline", folder="cosmos3")


def test_generate_writes_the_video_and_its_actions(tmp_path, cosmos3, ref):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

    clip = np.stack([np.random.default_rng(30 + i).integers(0, 255, (32, 48, 3), dtype=np.uint8) for i in range(5)])
    (tmp_path / "clip.mp4").write_bytes(encode_mp4(clip, 24))
    out = tmp_path / "out.mp4"
    flags = ["--prompt", "what moved", "--video", str(tmp_path / "clip.mp4"), "--seed", "8", "--extra-body"]
    flags += [json.dumps(TASK), "--num-inference-steps", "3", "--guidance-scale", "6"]
    done = subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "generate", str(cosmos3), *flags, "--output", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    actions_file = tmp_path / "out.actions.json"
    assert done.stdout.split() == [str(out), str(actions_file)]

    frames = list(decode_mp4((tmp_path / "clip.mp4").read_bytes())["frames"])  # what the CLI decodes
    cond = CosmosActionCondition(mode="inverse_dynamics", chunk_size=4, domain_name="av", resolution_tier=256,
                                 video=frames)  # fmt: skip
    expected = ref("what moved", action=cond, generator=gen(8), output_type="np", **STEPS)
    answer = json.loads(actions_file.read_text())
    assert answer["action_domain"] == "av" and answer["action_fps"] == 24
    got = torch.tensor(answer["actions"], dtype=torch.float32)  # JSON floats hold every float32 exactly
    assert got.shape == (4, 9) and torch.equal(got, expected.action[0])
    want = decode_mp4(encode_mp4((np.asarray(expected.video) * 255).round().astype(np.uint8), 24))["frames"]
    assert np.array_equal(decode_mp4(out.read_bytes())["frames"], want)
