"""The shipped replicated layout (deploy/replicated.yaml: two talker and two code2wav replicas, each in
its own process) gives every request the same speech as transformers' generate()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage import Omni

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DEPLOY = Path(__file__).parents[3] / "omnistage" / "models" / "qwen_omni" / "deploy" / "replicated.yaml"
GREEDY = [{"temperature": 0, "max_tokens": 12}, {"temperature": 0, "max_tokens": 20}]
PROMPTS = ["hello, who are you?", "the quick brown fox", "who are you?"]


def test_replicated_speech_stages_equal_transformers(omni_dir, reference):
    with Omni(str(omni_dir), deploy_config=str(DEPLOY), max_model_len=512) as omni:
        assert len(omni.engine.replicas(1)) == 2 and len(omni.engine.replicas(2)) == 2
        outs = omni.generate(PROMPTS, GREEDY, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.error is None
        ref = reference.run([{"role": "user", "content": prompt}], 12, 20)
        audio = torch.from_numpy(out.audio)
        assert audio.shape == ref.audio.shape and (audio - ref.audio).abs().max().item() <= 1e-4
