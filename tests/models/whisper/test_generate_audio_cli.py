"""``omnistage generate MODEL --audio FILE`` on the tiny Whisper, as a user runs it (a subprocess): it prints the
transcript the family gives in this process (``Omni`` on the same folder and request, itself checked against
transformers in test_whisper_vllm.py); with no ``--language`` it transcribes in the language transformers'
``detect_language`` hears; a pipeline that does not recognise speech, a language the model does not know and a
file that is not audio exit 2 naming the problem."""

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


def hf_language(folder: str, samples) -> str:
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    proc = WhisperProcessor.from_pretrained(folder)
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    feats = proc(samples, sampling_rate=RATE, return_tensors="pt").input_features
    with torch.no_grad():
        return proc.tokenizer.convert_ids_to_tokens(int(model.detect_language(feats)[0]))[2:-2]


def test_generate_audio_prints_the_transcript(tiny_model, tmp_path):
    from omnistage import Omni

    folder = str(tiny_model("whisper"))
    audio, deploy = tmp_path / "clip.wav", deploy_yaml(tmp_path / "deploy.yaml")
    samples, other = clip(3.0, 2), clip(1.5, 20)
    sf.write(audio, samples, RATE, subtype="FLOAT")  # lossless: both sides hear the same samples
    sf.write(other_wav := tmp_path / "other.wav", other, RATE, subtype="FLOAT")
    detected = hf_language(folder, other)
    assert detected != "en"  # a clip whose detected language is not the default
    given = cli(folder, "--audio", str(audio), "--language", "de", "--max-tokens", str(MAX_TOKENS),
                "--deploy-config", deploy)
    assert given.returncode == 0, given.stderr[-3000:]
    # no --language: the one Whisper detects (transformers' detect_language), as the transcription route does
    heard = cli(folder, "--audio", str(other_wav), "--max-tokens", str(MAX_TOKENS), "--deploy-config", deploy)
    assert heard.returncode == 0, heard.stderr[-3000:]
    with Omni(model=folder, **ENGINE) as omni:
        want = omni.generate([{"prompt": "", "multi_modal_data": {"audio": (x, RATE)},
                               "additional_information": {"language": language, "task": "transcribe"}}
                              for x, language in ((samples, "de"), (other, detected))],
                             [{"max_tokens": MAX_TOKENS}], use_tqdm=False)
    for done, out in zip((given, heard), want):
        assert out.text and ("\n" + done.stdout).endswith("\n" + out.text + "\n")  # (vLLM may log to stdout first)
    unknown = cli(folder, "--audio", str(audio), "--language", "xx", "--deploy-config", deploy)
    assert unknown.returncode == 2 and "--language" in unknown.stderr

    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"this is not audio")
    failed = cli(folder, "--audio", str(bad), "--deploy-config", deploy)
    assert failed.returncode == 2 and "--audio" in failed.stderr
    demo = cli("--audio", str(audio))  # the demo pipeline draws pictures
    assert demo.returncode == 2 and "does not recognise speech" in demo.stderr
