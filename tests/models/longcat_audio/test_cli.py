"""``omnistage generate FOLDER --duration S --output out.wav`` as a user runs it (a subprocess): the WAV holds
``LongCatAudioDiTPipeline.__call__``'s clip for the same seed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from omnistage.models.longcat_audio.tiny import HOP, SAMPLE_RATE

pytestmark = pytest.mark.slow  # a subprocess importing torch and diffusers: 20 s or more


def test_generate_writes_the_clip(tmp_path, longcat_audio_dir, reference):
    out = tmp_path / "out.wav"
    flags = ["--prompt", "a dog barking", "--seed", "4", "--num-inference-steps", "2", "--duration", "0.2"]
    done = subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "generate", str(longcat_audio_dir), *flags, "--output", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    audio, rate = soundfile.read(out, dtype="float32")
    expected = reference("a dog barking", seed=4, duration=0.2, num_inference_steps=2)
    assert rate == SAMPLE_RATE and audio.shape == expected.shape == (int(0.2 * SAMPLE_RATE // HOP) * HOP,)
    # soundfile writes the float clip as 16-bit PCM (its default WAV subtype), flooring: up to one 16-bit step,
    # plus the engine's float noise against diffusers (<= 9.1e-7 measured, test_engine.py)
    assert np.abs(audio - np.clip(expected, -1, 1)).max() <= 1 / 32768 + 5e-6
