"""``omnistage generate MODEL --audio FILE`` on the tiny Whisper, as a user runs it (a subprocess): it prints the
transcript transformers' greedy ``WhisperForConditionalGeneration.generate`` gives for the same clip and language
(the family's engine equals it token for token: test_whisper_vllm.py); with no ``--language`` it transcribes in the
language transformers' ``detect_language`` hears; a pipeline that does not recognise speech, a language the model
does not know and a file that is not audio exit 2 naming the problem."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import soundfile as sf

from tests.models.asr_cases import RATE, TransformersWhisper, clip
from tests.models.whisper.cases import ENGINE

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 10


def deploy_yaml(path) -> str:
    path.write_text(
        "stages:\n  - stage_id: 0\n"
        + "".join(f"    {k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in ENGINE.items())
    )
    return str(path)


def cli(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "generate", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_generate_audio_prints_the_transcript(tiny_model, tmp_path):
    folder = str(tiny_model("whisper"))
    audio, deploy = tmp_path / "clip.wav", deploy_yaml(tmp_path / "deploy.yaml")
    samples, other = clip(3.0, 2), clip(1.5, 20)
    sf.write(audio, samples, RATE, subtype="FLOAT")  # lossless: both sides hear the same samples
    sf.write(other_wav := tmp_path / "other.wav", other, RATE, subtype="FLOAT")
    hf = TransformersWhisper(folder)
    detected = hf.language(other)
    assert detected != "en"  # a clip whose detected language is not the default
    want = [hf.transcript(samples, "de", MAX_TOKENS), hf.transcript(other, detected, MAX_TOKENS)]
    given = cli(
        folder, "--audio", str(audio), "--language", "de", "--max-tokens", str(MAX_TOKENS), "--deploy-config", deploy
    )
    assert given.returncode == 0, given.stderr[-3000:]
    # no --language: the one Whisper detects (transformers' detect_language), as the transcription route does
    heard = cli(folder, "--audio", str(other_wav), "--max-tokens", str(MAX_TOKENS), "--deploy-config", deploy)
    assert heard.returncode == 0, heard.stderr[-3000:]
    for done, text in zip((given, heard), want):
        assert text and ("\n" + done.stdout).endswith("\n" + text + "\n")  # (vLLM may log to stdout first)
    unknown = cli(folder, "--audio", str(audio), "--language", "xx", "--deploy-config", deploy)
    assert unknown.returncode == 2 and "--language" in unknown.stderr

    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"this is not audio")
    failed = cli(folder, "--audio", str(bad), "--deploy-config", deploy)
    assert failed.returncode == 2 and "--audio" in failed.stderr
    demo = cli("--audio", str(audio))  # the demo pipeline draws pictures
    assert demo.returncode == 2 and "does not recognise speech" in demo.stderr
