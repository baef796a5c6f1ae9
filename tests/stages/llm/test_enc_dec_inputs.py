"""An llm stage's encoder-decoder input (Whisper's explicit prompt), parsed without vLLM: its shape and the
fields its problems name. Rendering and generation are tested on vLLM in tests/models/whisper."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.errors import InvalidRequestError
from omnistage.stages.llm.inputs import decoder_token_ids, parse

AUDIO = (np.zeros(1600, np.float32), 16000)


def test_parse_keeps_decoder_text_and_encoder_media():
    p = parse(
        {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": AUDIO}},
            "decoder_prompt": "<|startoftranscript|>",
        }
    )
    assert p.text == "<|startoftranscript|>" and p.encoder_text == "" and p.needs_renderer
    assert p.media == [("encoder_prompt.multi_modal_data.audio[0]", "audio")]
    assert p.multi_modal_data["audio"][0][1] == 16000


@pytest.mark.parametrize(
    "inputs, field",
    [
        ({"encoder_prompt": "audio", "decoder_prompt": ""}, "encoder_prompt"),
        ({"encoder_prompt": {"prompt": 3}, "decoder_prompt": ""}, "encoder_prompt"),
        ({"encoder_prompt": {"prompt": ""}, "decoder_prompt": None}, "decoder_prompt"),
        (
            {"encoder_prompt": {"prompt": ""}, "decoder_prompt": "", "multi_modal_data": {"audio": AUDIO}},
            "multi_modal_data",
        ),
        ({"prompt": "hi", "decoder_prompt": "<|startoftranscript|>"}, "encoder_prompt"),
    ],
)
def test_bad_shapes_name_the_field(inputs, field):
    with pytest.raises(InvalidRequestError) as e:
        parse(inputs)
    assert e.value.field == field


def test_decoder_token_ids():
    assert decoder_token_ids(
        {
            "type": "enc_dec",
            "encoder_prompt": {"prompt_token_ids": [0] * 5},
            "decoder_prompt": {"prompt_token_ids": [1, 2]},
        }
    ) == [1, 2]
    assert decoder_token_ids({"type": "token", "prompt_token_ids": [3]}) == [3]
