"""Qwen3-Omni and Qwen2.5-Omni as speech recognisers: ``/v1/audio/transcriptions`` and ``/translations`` through
the official ``openai`` client on the tiny folders, the text equal to transformers' ``generate`` (greedy, thinker
only) on the same chat turn (audio + the family's instruction, omnistage/models/qwen_omni/transcription.py), and
the talker never runs (the server's per-stage run metrics name the thinker only)."""

from __future__ import annotations

import io
import os

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch

from omnistage.models.qwen_omni.transcription import instruction
from omnistage.testing.server import serve_engine
from tests.models.qwen_omni import media

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MAX_TOKENS = 8
CLIP = media.clip(1.5, 3)  # PCM16-exact samples: the WAV round trip is lossless on both sides


def wav(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, media.RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


FAMILIES = {"qwen3_omni": "Qwen3OmniMoe", "qwen2_5_omni": "Qwen2_5Omni"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tiny_model):
    """(family, server url, transformers reference) — transformers first, then one engine at a time."""
    import transformers

    from omnistage import AsyncOmni

    name, folder = request.param, tiny_model(request.param)
    prefix = FAMILIES[name]
    processor = getattr(transformers, f"{prefix}Processor").from_pretrained(str(folder))
    model = getattr(transformers, f"{prefix}ForConditionalGeneration").from_pretrained(
        str(folder), dtype=torch.float32).eval()

    def reference(text: str) -> tuple[list[int], str]:
        messages = [{"role": "user", "content": [{"type": "audio", "audio": "x"}, {"type": "text", "text": text}]}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=prompt, audio=[CLIP], return_tensors="pt")
        with torch.no_grad():
            seq = model.generate(**inputs, return_audio=False, thinker_max_new_tokens=MAX_TOKENS,
                                 thinker_do_sample=False)
        seq = seq[0] if isinstance(seq, tuple) else getattr(seq, "sequences", seq)
        ids = seq[0, inputs["input_ids"].shape[1]:].tolist()
        # random weights emit byte tokens: a character cut by max_tokens is left out of the text (vLLM's
        # detokenizer holds incomplete UTF-8 back), where decode writes U+FFFD for it
        return ids, processor.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")

    expected = {case: reference(instruction(*case)) for case in
                [("en", "transcribe", ""), ("de", "transcribe", ""), ("en", "transcribe", "hello"),
                 ("fr", "translate", "")]}
    with serve_engine(AsyncOmni(str(folder), max_model_len=1024), ready_timeout=300,
                      served_model_name="tiny") as srv:
        yield name, srv.url, expected


def test_transcripts_equal_transformers_and_the_talker_never_runs(family):
    name, url, expected = family
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    extra = {"max_tokens": MAX_TOKENS}
    file = ("clip.wav", wav(CLIP), "audio/wav")

    def text(language, prompt=""):
        kw = {"prompt": prompt} if prompt else {}
        return client.audio.transcriptions.create(model="tiny", file=file, language=language, extra_body=extra,
                                                  **kw).text

    assert text("en") == expected[("en", "transcribe", "")][1]
    assert text("de") == expected[("de", "transcribe", "")][1]
    assert text("en", "hello") == expected[("en", "transcribe", "hello")][1]
    out = client.audio.translations.create(model="tiny", file=file, extra_body={**extra, "language": "fr"})
    assert out.text == expected[("fr", "translate", "")][1]
    assert len({tuple(ids) for ids, _ in expected.values()}) > 1  # the instruction reaches the model
    verbose = client.audio.transcriptions.create(model="tiny", file=file, language="en", extra_body=extra,
                                                 response_format="verbose_json")
    ids, text_en = expected[("en", "transcribe", "")]
    assert verbose.text == text_en and verbose.duration == pytest.approx(1.5)
    assert verbose.segments[0].tokens == ids  # token for token transformers' greedy generate
    # the speaking pipeline's talker took no request: only the thinker's run time was recorded
    metrics = httpx.get(url + "/metrics", timeout=30).text
    runs = {line.split('stage="')[1].split('"')[0]: float(line.split()[-1]) for line in metrics.splitlines()
            if line.startswith("omnistage_stage_run_seconds_count")}
    assert runs == {"0": 5.0}, runs


def test_bad_language_names_the_field(family):
    _, url, _ = family
    r = httpx.post(url + "/v1/audio/transcriptions", data={"model": "tiny", "language": "xx"},
                   files={"file": ("a.wav", wav(CLIP), "audio/wav")}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "language"
