"""The omni families' recogniser hook without engines (transcription.py): a recogniser request becomes one user
turn of audio + instruction whose audio decodes back to the very samples, greedy by default; chat requests pass
unchanged; bad language / task / audio are 400s naming the field. (The model's answer to it, against
transformers: tests/models/omni_transcripts.py.)"""

from __future__ import annotations

import base64
import copy
import io

import numpy as np
import pytest
import soundfile as sf

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.transcription_chat import to_transcription_chat
from omnistage.pipeline import get_pipeline
from omnistage.speech import SpeechInput, Transcription

SAMPLES = np.random.default_rng(0).standard_normal(8000).astype(np.float32) * 0.1


def request(language="en", task="transcribe", prompt="", **rest):
    return {
        "prompt": prompt,
        "multi_modal_data": {"audio": (SAMPLES, 16000)},
        "transcription": Transcription(language=language, task=task),
        **rest,
    }


def test_a_recogniser_request_becomes_one_chat_turn():
    prompt, params = request(), [{}]
    to_transcription_chat(prompt, params)
    (message,) = prompt["messages"]
    audio, text = message["content"]
    assert set(prompt) == {"messages"} and message["role"] == "user"
    assert text == {"type": "text", "text": "Transcribe this audio into English."}
    heard, rate = sf.read(io.BytesIO(base64.b64decode(audio["input_audio"]["data"])), dtype="float32")
    assert audio["input_audio"]["format"] == "wav" and rate == 16000 and np.array_equal(heard, SAMPLES)
    assert params == [{"temperature": 0.0, "max_tokens": 448}]


@pytest.mark.parametrize(
    "args, words",
    [
        (("de", "transcribe", ""), "Transcribe this audio into German."),
        (("en", "transcribe", "Hello, Anna."), "Transcribe this audio into English. Hello, Anna."),
        (("fr", "translate", ""), "Translate this audio from French into English."),
        (("en", "translate", ""), "Translate this audio into English."),
    ],
)
def test_instruction_wording(args, words):
    prompt = request(*args)
    to_transcription_chat(prompt, [{"temperature": 0.7, "max_tokens": 5}])
    assert prompt["messages"][0]["content"][1]["text"] == words


def test_the_request_keeps_its_own_knobs_and_other_information():
    prompt, params = request(speech=SpeechInput(voice="Ethan")), [{"temperature": 0.7, "max_tokens": 5}]
    to_transcription_chat(prompt, params)
    assert params == [{"temperature": 0.7, "max_tokens": 5}]
    assert prompt["speech"] == SpeechInput(voice="Ethan") and "transcription" not in prompt


def test_chat_requests_pass_unchanged():
    for prompt in (
        {"prompt": "hi"},
        {"messages": [{"role": "user", "content": "hi"}]},
        {"prompt": "x", "multi_modal_data": {"audio": (SAMPLES, 16000)}, "speech": SpeechInput(voice="Ethan")},
    ):
        before = copy.deepcopy(prompt)
        to_transcription_chat(prompt, [{}])
        assert repr(prompt) == repr(before)


@pytest.mark.parametrize(
    "prompt, field",
    [
        (request(language="xx"), "language"),
        (request(task="summarise"), "task"),
        ({"prompt": "", "transcription": Transcription()}, "multi_modal_data.audio"),
        (request(prompt=3), "prompt"),
    ],
)
def test_bad_requests_name_the_field(prompt, field):
    with pytest.raises(InvalidRequestError) as e:
        to_transcription_chat(prompt, [{}])
    assert e.value.field == field


@pytest.mark.parametrize("name", ["qwen_omni", "qwen_omni_thinker", "qwen2_5_omni", "qwen2_5_omni_thinker"])
def test_every_omni_pipeline_serves_the_transcription_routes(name):
    pipeline = get_pipeline(name)
    assert pipeline.shape_request is to_transcription_chat
    info = pipeline.info.transcription
    assert info.sample_rate == 16000 and info.window_s == 30 and "en" in info.languages
