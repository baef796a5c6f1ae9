"""``omnistage generate MODEL --audio FILE`` on the tiny Whisper, as a user runs it (a subprocess): it prints the
transcript the family gives in this process (``Omni`` on the same folder and request, itself checked against
transformers in test_whisper_vllm.py); a pipeline that does not recognise speech and a file that is not audio
exit 2 naming the problem."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import soundfile as sf

from tests.models.whisper.cases import ENGINE, RATE, clip

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_TOKENS = 10


def deploy_yaml(path) -> str:
    path.write_text("stages:\n  - stage_id: 0\n" + "".join(f"    {k}: {str(v).lower() if isinstance(v, bool) else v}\n"
                                                          for k, v in ENGINE.items()))
    return str(path)


def cli(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return subprocess.run([sys.executable, "-m", "omnistage.cli.main", "generate", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_generate_audio_prints_the_transcript(tiny_model, tmp_path):
    from omnistage import Omni

    folder = str(tiny_model("whisper"))
    audio, deploy = tmp_path / "clip.wav", deploy_yaml(tmp_path / "deploy.yaml")
    samples = clip(3.0, 2)
    sf.write(audio, samples, RATE, subtype="FLOAT")  # lossless: both sides hear the same samples
    done = cli(folder, "--audio", str(audio), "--language", "de", "--max-tokens", str(MAX_TOKENS),
               "--deploy-config", deploy)
    assert done.returncode == 0, done.stderr[-3000:]
    with Omni(model=folder, **ENGINE) as omni:
        (want,) = omni.generate([{"prompt": "", "multi_modal_data": {"audio": (samples, RATE)},
                                  "additional_information": {"language": "de", "task": "transcribe"}}],
                                [{"max_tokens": MAX_TOKENS}], use_tqdm=False)
    assert want.text and ("\n" + done.stdout).endswith("\n" + want.text + "\n")  # (vLLM may log to stdout first)

    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"this is not audio")
    failed = cli(folder, "--audio", str(bad), "--deploy-config", deploy)
    assert failed.returncode == 2 and "--audio" in failed.stderr
    demo = cli("--audio", str(audio))  # the demo pipeline draws pictures
    assert demo.returncode == 2 and "does not recognise speech" in demo.stderr
