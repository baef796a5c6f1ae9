"""What the speech benchmarks read from a pipeline's declarations (benchmarks/speech_fixtures.py) matches the models:
a codec_tts folder's declared samples per frame is its codec's own, and the committed Qwen3-TTS checkpoints are
told apart by what they declare (the Base one only clones, the CustomVoice one has preset voices)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from speech_fixtures import declared, stage0_uses_vllm, tiny_folder  # noqa: E402

pytestmark = pytest.mark.slow
torch.set_num_threads(1)


@pytest.mark.parametrize("name", ["codec_tts", "llasa"])
def test_declared_frames_are_the_codecs(name, tmp_path):
    from omnistage.models.shared.codec_lm.codec import load_codec

    folder = tiny_folder(name, tmp_path, clones=False)
    pipeline = declared(folder)
    frames = pipeline.info.speaks.frames
    codec = load_codec(folder / "codec")
    assert frames.samples_per_frame == codec.samples_per_frame
    assert frames.codec == {"codec_tts": "mimi", "llasa": "xcodec2"}[name]
    assert stage0_uses_vllm(pipeline)


def test_committed_checkpoints_are_told_apart_by_their_declarations(tmp_path):
    base = tiny_folder("qwen3_tts", tmp_path, clones=True)
    voices = tiny_folder("qwen3_tts", tmp_path, clones=False)
    assert (base.name, voices.name) == ("base", "custom_voice")
    speech = declared(base).info.speaks
    assert speech.needs_voice and speech.clones_from_embedding and not speech.voices
    assert not declared(voices).info.speaks.needs_voice
    assert speech.frames.lm_tokens(6) == 7  # the talker's closing token makes no frame
    assert not stage0_uses_vllm(declared(base))
