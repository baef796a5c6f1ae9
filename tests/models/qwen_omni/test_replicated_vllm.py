"""The shipped replicated layout (deploy/replicated.yaml: two talker and two code2wav replicas, each in
its own process) gives every request the same speech as transformers' generate()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnistage import Omni
from tests.models import omni_media as media

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

DEPLOY = Path(__file__).parents[3] / "omnistage" / "models" / "qwen_omni" / "deploy" / "replicated.yaml"
GREEDY = [{"temperature": 0, "max_tokens": 12}, {"temperature": 0, "max_tokens": 20}]
PROMPTS = ["hello, who are you?", "the quick brown fox", "who are you?"]


def test_replicated_speech_stages_equal_transformers(omni_dir, reference):
    """Text prompts and an audio prompt (its thinker hidden states cross into the talker's child process)."""
    clip = media.clip(1.0, 0)
    heard = [
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": media.wav_base64(clip), "format": "wav"}},
                {"type": "text", "text": "what did i just say?"},
            ],
        }
    ]
    with Omni(str(omni_dir), deploy_config=str(DEPLOY), max_model_len=512) as omni:
        assert len(omni.engine.replicas(1)) == 2 and len(omni.engine.replicas(2)) == 2
        outs = omni.generate([*PROMPTS, {"messages": heard}], GREEDY, use_tqdm=False)
    template = reference.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "audio", "audio": "x"}, heard[0]["content"][1]]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    refs = [reference.run([{"role": "user", "content": p}], 12, 20) for p in PROMPTS]
    refs.append(
        reference.run_inputs(dict(reference.processor(text=template, audio=[clip], return_tensors="pt")), 12, 20)
    )
    for ref, out in zip(refs, outs):
        assert out.error is None
        audio = torch.from_numpy(out.audio)
        assert audio.shape == ref.audio.shape and (audio - ref.audio).abs().max().item() <= 1e-4
