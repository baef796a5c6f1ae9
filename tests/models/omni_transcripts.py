"""Qwen3-Omni and Qwen2.5-Omni as speech recognisers, checked on each family's HTTP test server
(tests/models/qwen_omni/server/test_http.py, tests/models/qwen2_5_omni/server/test_http.py): ``/v1/audio/transcriptions`` and ``/translations`` through
the official ``openai`` client, the text equal to transformers' ``generate`` (greedy, thinker only) on the same
chat turn (audio + the family's instruction, omnistage/models/shared/transcription_chat.py), and the talker never
runs (the server's per-stage run counts grow for the thinker only)."""

from __future__ import annotations

import io
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch

from omnistage.models.shared.transcription_chat import instruction
from tests.models import omni_media as media

MAX_TOKENS = 8
CLIP = media.clip(1.5, 3)  # PCM16-exact samples: the WAV round trip is lossless on both sides
CASES = [("en", "transcribe", ""), ("de", "transcribe", ""), ("en", "transcribe", "hello"), ("fr", "translate", "")]


def wav(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, media.RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def expected(processor: Any, model: Any) -> dict[tuple[str, str, str], tuple[list[int], str]]:
    """Per (language, task, prompt): transformers' greedy thinker tokens and text on the family's turn."""

    def reference(text: str) -> tuple[list[int], str]:
        messages = [{"role": "user", "content": [{"type": "audio", "audio": "x"}, {"type": "text", "text": text}]}]
        prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=prompt, audio=[CLIP], return_tensors="pt")
        with torch.no_grad():
            seq = model.generate(
                **inputs, return_audio=False, thinker_max_new_tokens=MAX_TOKENS, thinker_do_sample=False
            )
        seq = seq[0] if isinstance(seq, tuple) else getattr(seq, "sequences", seq)
        ids = seq[0, inputs["input_ids"].shape[1] :].tolist()
        # random weights emit byte tokens: a character cut by max_tokens is left out of the text (vLLM's
        # detokenizer holds incomplete UTF-8 back), where decode writes U+FFFD for it
        return ids, processor.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")

    return {case: reference(instruction(*case)) for case in CASES}


def stage_runs(url: str) -> dict[str, float]:
    metrics = httpx.get(url + "/metrics", timeout=30).text
    return {
        line.split('stage="')[1].split('"')[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("omnistage_stage_run_seconds_count")
    }


def check_transcripts(url: str, model: str, want: dict[tuple[str, str, str], tuple[list[int], str]]) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    extra = {"max_tokens": MAX_TOKENS}
    file = ("clip.wav", wav(CLIP), "audio/wav")
    before = stage_runs(url)

    def text(language, prompt=""):
        kw = {"prompt": prompt} if prompt else {}
        return client.audio.transcriptions.create(
            model=model, file=file, language=language, extra_body=extra, **kw
        ).text

    assert text("en") == want[("en", "transcribe", "")][1]
    assert text("de") == want[("de", "transcribe", "")][1]
    assert text("en", "hello") == want[("en", "transcribe", "hello")][1]
    out = client.audio.translations.create(model=model, file=file, extra_body={**extra, "language": "fr"})
    assert out.text == want[("fr", "translate", "")][1]
    assert len({tuple(ids) for ids, _ in want.values()}) > 1  # the instruction reaches the model
    verbose = client.audio.transcriptions.create(
        model=model, file=file, language="en", extra_body=extra, response_format="verbose_json"
    )
    ids, text_en = want[("en", "transcribe", "")]
    assert verbose.text == text_en and verbose.duration == pytest.approx(1.5)
    assert verbose.segments[0].tokens == ids  # token for token transformers' greedy generate
    # the speaking pipeline's talker took none of these requests: only the thinker's run count grew
    after = stage_runs(url)
    grown = {stage: n - before.get(stage, 0.0) for stage, n in after.items() if n != before.get(stage, 0.0)}
    assert grown == {"0": 5.0}, (before, after)


def check_bad_language(url: str, model: str) -> None:
    r = httpx.post(
        url + "/v1/audio/transcriptions",
        data={"model": model, "language": "xx"},
        files={"file": ("a.wav", wav(CLIP), "audio/wav")},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "language"
