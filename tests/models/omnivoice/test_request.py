"""OmniVoice's request parsing and post-processing against the reference package (goldens): the prompt a
request becomes (language, voice design, the length estimated from the text or fixed by ``duration``), a
reference clip's codes and loudness, and the silence trimming on audio with long and short silences (which
the tiny model's noise never has)."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.errors import InvalidRequestError
from omnistage.models.omnivoice.clone import clip_codes, with_end_punctuation
from omnistage.models.omnivoice.engine import checked_estimate, parse_request
from omnistage.models.omnivoice.postprocess import remove_silence
from omnistage.models.shared.higgs_tokenizer.encoder import HiggsAudioEncoder
from omnistage.speech import check_speech
from tests.models.omnivoice.conftest import GOLDEN, TINY, golden


def request_of_case(g) -> tuple[dict, dict]:
    info = {"language": str(g["language"]) or None, "instructions": str(g["instruct"]) or None}
    if "ref_audio" in g:
        info.update(ref_audio=(g["ref_audio"], 24000), ref_text=str(g["ref_text"]))
    params = {"seed": int(g["seed"]), "num_inference_steps": int(g["num_step"])}
    if float(g["duration"]):
        params["duration"] = float(g["duration"])
    return {"prompt": str(g["text"]), "speech": check_speech(info)}, params


def parsed(prompt: dict, params: dict):
    return parse_request(prompt["prompt"], prompt["speech"], params)


@pytest.mark.parametrize("name", ["auto", "design", "duration"])
def test_request_becomes_the_reference_prompt(omnivoice_lm, name):
    g = golden(name)
    u = parsed(*request_of_case(g))
    assert u.target_len == int(g["target_len"])  # the estimate from the text, or the duration's frames
    prompt, _ = omnivoice_lm.prompt(u.text, u.target_len, language=u.language, instruct=u.instruct)
    np.testing.assert_array_equal(prompt[0].numpy(), g["prompt_ids"])


def test_clone_request_becomes_the_reference_prompt(omnivoice_lm):
    """The clip trimmed and encoded (codes, loudness), the transcript punctuated, the length estimated at the
    clip's pace: the package's clone prompt."""
    g = golden("clone")
    u = parsed(*request_of_case(g))
    assert u.ref_text == str(g["ref_text_used"])
    assert with_end_punctuation(" a clip ") == "a clip." and with_end_punctuation("你好") == "你好。"
    encoder = HiggsAudioEncoder(TINY / "audio_tokenizer")
    codes, rms = clip_codes(encoder, u.clip, 24000, encoder.cfg.hop_length)
    np.testing.assert_array_equal(codes.numpy(), g["ref_codes"])
    assert rms == float(g["ref_rms"])
    assert checked_estimate(u.text, u.speed, u.ref_text, codes.shape[-1]) == int(g["target_len"])
    prompt, _ = omnivoice_lm.prompt(
        u.text, int(g["target_len"]), language=u.language, ref_text=u.ref_text, ref_codes=codes
    )
    np.testing.assert_array_equal(prompt[0].numpy(), g["prompt_ids"])


def test_silence_trimming_equals_the_reference():
    g = np.load(GOLDEN / "silence.npz")
    cuts = 0
    for i in range(len(g.files) // 2):
        x = g[f"in{i}"].astype(np.float32) / 32768.0
        got = remove_silence(x, 24000)
        np.testing.assert_array_equal(np.round(got * 32768.0).astype(np.int16), g[f"out{i}"], err_msg=str(i))
        cuts += got.size < x.size
    assert cuts == len(g.files) // 2  # every case really trims


@pytest.mark.parametrize(
    "info, params, field",
    [
        ({"voice": "bob"}, {}, "voice"),
        ({"ref_text": "no clip"}, {}, "ref_text"),
        ({"ref_audio": (np.zeros(2400, np.float32), 24000)}, {}, "ref_text"),
        ({"ref_audio": (np.zeros(31 * 24000, np.float32), 24000), "ref_text": "long"}, {}, "ref_audio"),
        ({"instructions": "female, purple"}, {}, "instructions"),
        ({"instructions": "male, female"}, {}, "instructions"),
        ({"language": "Klingonese"}, {}, "language"),
        ({"speed": 9.0}, {}, "speed"),
        ({}, {"num_inference_steps": 0}, "num_inference_steps"),
        ({}, {"duration": -1.0}, "duration"),
        ({}, {"duration": 600.0}, "duration"),
        ({}, {"temperature": 0.5}, "temperature"),
    ],
)
def test_bad_requests_name_the_field(info, params, field):
    with pytest.raises(InvalidRequestError) as e:
        parse_request("hello", check_speech(info), params)
    assert e.value.field == field
