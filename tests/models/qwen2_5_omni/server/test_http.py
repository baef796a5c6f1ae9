"""Qwen2.5-Omni through the real HTTP server (``omnistage serve`` subprocess): chat with text and speech, voices,
media in, errors, transcriptions — against transformers' generate() (tests/models/qwen2_5_omni/conftest.py)."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import soundfile

from tests.models import omni_media as media
from tests.models import omni_transcripts
from tests.models.qwen2_5_omni.conftest import SEED, TransformersReference

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

THINK, TALK = 10, 16
PROMPT = "hello, who are you?"
BODY = {
    "model": "tiny-omni25",
    "messages": [{"role": "user", "content": PROMPT}],
    "temperature": 0,
    "max_tokens": THINK,
    "seed": SEED,
    "sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}],
}
STEP = 1 / 32767  # one 16-bit step (the WAV's int16 / 32768 vs the float waveform)
FLOAT = 1e-5  # omnistage's float waveform vs transformers'
CLIP = media.clip(1.0, 0)


@pytest.fixture(scope="module")
def reference(tiny_model):
    return TransformersReference(tiny_model("qwen2_5_omni"))


def wav_of(body: dict) -> np.ndarray:
    audio = body["choices"][0]["message"]["audio"]
    assert audio["format"] == "wav"
    wav, rate = soundfile.read(io.BytesIO(base64.b64decode(audio["data"])), dtype="float32")
    assert rate == 24000
    return wav


def assert_speaks_as(body: dict, reference: TransformersReference, run) -> None:
    message = body["choices"][0]["message"]
    # random weights can end a reply inside a UTF-8 sequence: vLLM's incremental detokenizer holds those bytes
    # back where a whole decode writes U+FFFD (the in-process tests compare the token ids themselves)
    assert message["content"] == reference.tok.decode(run.reply, skip_special_tokens=True).rstrip("\ufffd")
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(run.prompt_ids) and usage["completion_tokens"] == len(run.reply)
    wav = wav_of(body)
    assert wav.shape == run.audio.shape and np.abs(wav - np.clip(run.audio.numpy(), -1, 1)).max() <= STEP + FLOAT


def test_chat_returns_text_and_a_wav_within_one_16bit_step(server, reference):
    run = reference.run([{"role": "user", "content": PROMPT}], THINK, TALK)
    r = httpx.post(f"{server}/v1/chat/completions", json=BODY, timeout=300)
    assert r.status_code == 200, r.text
    assert_speaks_as(r.json(), reference, run)


def test_a_thinker_that_stops_on_its_first_token_answers_its_text_without_audio(server, reference):
    """Speech asked, but the thinker stops after one token (max_tokens=1): the talker has nothing to say (it reads
    the reply without its last token). A 200 with that text, no audio part and the thinker's finish_reason, whole
    and streamed, read with the openai client."""
    run = reference.run([{"role": "user", "content": PROMPT}], THINK, TALK)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    ask = dict(
        model="tiny-omni25",
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=1,
        seed=SEED,
        modalities=["text", "audio"],
        extra_body={"sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}]},
    )
    text = reference.tok.decode(run.reply[:1], skip_special_tokens=True).rstrip("\ufffd")  # greedy: its first
    finish = "stop" if run.reply[0] == reference.tok.convert_tokens_to_ids("<|im_end|>") else "length"
    whole = client.chat.completions.create(**ask)
    assert whole.choices[0].message.content == text and whole.choices[0].message.audio is None
    assert whole.choices[0].finish_reason == finish
    choices = [c.choices[0] for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    assert "".join(c.delta.content or "" for c in choices) == text
    assert not [c for c in choices if getattr(c.delta, "audio", None) and c.delta.audio.get("data")]
    assert [c.finish_reason for c in choices if c.finish_reason] == [finish]


def test_chat_with_an_audio_clip_speaks_as_transformers(server, reference):
    parts = [
        {"type": "input_audio", "input_audio": {"data": media.wav_base64(CLIP), "format": "wav"}},
        {"type": "text", "text": "what did i just say?"},
    ]
    run = reference.run(
        [{"role": "user", "content": [{"type": "audio", "audio": "x"}, parts[1]]}], THINK, TALK, mm={"audio": [CLIP]}
    )
    r = httpx.post(
        f"{server}/v1/chat/completions", json={**BODY, "messages": [{"role": "user", "content": parts}]}, timeout=300
    )
    assert r.status_code == 200, r.text
    assert_speaks_as(r.json(), reference, run)


def test_voices_and_the_chosen_voice(server, reference):
    assert httpx.get(f"{server}/v1/audio/voices").json()["voices"] == ["Chelsie", "Ethan"]
    run = reference.run([{"role": "user", "content": PROMPT}], THINK, TALK, speaker="Ethan")
    r = httpx.post(
        f"{server}/v1/chat/completions", json={**BODY, "audio": {"voice": "Ethan", "format": "wav"}}, timeout=300
    )
    assert r.status_code == 200, r.text
    assert_speaks_as(r.json(), reference, run)


@pytest.mark.parametrize(
    "part, param",
    [
        (
            {"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv", "format": "wav"}},
            "messages[0].content[1].input_audio",
        ),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}, "messages[0].content[1].image_url"),
    ],
)
def test_a_bad_media_part_is_a_400_naming_it_and_the_server_keeps_serving(server, part, param):
    content = [{"type": "text", "text": "look"}, part]
    r = httpx.post(
        f"{server}/v1/chat/completions", json={**BODY, "messages": [{"role": "user", "content": content}]}, timeout=300
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    ok = httpx.post(f"{server}/v1/chat/completions", json=BODY, timeout=300)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["audio"]["data"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({**BODY, "audio": {"voice": "Bob"}}, "audio.voice"),
        ({**BODY, "sampling_params_list": [None, {"temprature": 0.1}]}, "temprature"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_transcriptions_equal_transformers_and_the_talker_never_runs(server, reference):
    omni_transcripts.check_transcripts(
        server, "tiny-omni25", omni_transcripts.expected(reference.processor, reference.model)
    )
    omni_transcripts.check_bad_language(server, "tiny-omni25")
