"""The typed request parts (speech input, transcription options, chat template kwargs, a system prompt, an image
size) are checked once, at admission: a wrong-typed field is an ``InvalidRequestError`` naming it, before any
stage runs; a mapping of a part's fields is taken as the typed object."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.engine.request import normalize_prompt
from omnistage.errors import InvalidRequestError
from omnistage.speech import SpeechInput, SpeechTurn, Transcription, check_speech


def test_a_mapping_becomes_the_typed_speech_input():
    clip = np.zeros(2400, np.float32)
    prompt = normalize_prompt(
        {
            "prompt": "hi",
            "speech": {"voice": "1", "ref_audio": (clip, 24000), "context": [{"speaker": "0", "text": "before"}]},
        }
    )
    speech = prompt["speech"]
    assert isinstance(speech, SpeechInput) and speech.voice == "1" and speech.ref_audio[0] is clip
    assert speech.context == (SpeechTurn(speaker="0", text="before"),)
    assert normalize_prompt({"prompt": "x", "transcription": {"task": "translate"}})["transcription"] == Transcription(
        task="translate"
    )


def test_an_instance_is_checked_too():
    # a struct's constructor does not check types: admission does
    with pytest.raises(InvalidRequestError) as e:
        normalize_prompt({"prompt": "hi", "speech": SpeechInput(speed="fast")})
    assert e.value.field == "speed"
    assert check_speech(SpeechInput(speed=2)).speed == 2.0  # an integer speed is a number


@pytest.mark.parametrize(
    "key, value, field",
    [
        ("speech", {"voice": 1}, "voice"),
        ("speech", {"ref_audio": "clip.wav"}, "ref_audio"),
        ("speech", {"ref_audio": (np.zeros(4), "24k")}, "ref_audio[1]"),
        ("speech", {"x_vector_only_mode": "yes"}, "x_vector_only_mode"),
        ("speech", {"enable_text_splitting": "yes"}, "enable_text_splitting"),
        ("speech", {"context": [{"speaker": "0", "text": 3}]}, "context[0].text"),
        ("speech", {"speaker": "1"}, "speaker"),  # not a field: refused, not ignored
        ("speech", "Vivian", "speech"),
        ("transcription", {"timestamps": "yes"}, "timestamps"),
        ("transcription", "en", "transcription"),
        ("chat_template_kwargs", ["add_generation_prompt"], "chat_template_kwargs"),
        ("system_prompt", 3, "system_prompt"),
        ("image_size", (64,), "image_size"),
        ("image_size", ("64", 64), "image_size"),
    ],
)
def test_a_wrong_typed_part_names_its_field(key, value, field):
    with pytest.raises(InvalidRequestError) as e:
        normalize_prompt({"prompt": "hi", key: value})
    assert e.value.field == field, e.value
