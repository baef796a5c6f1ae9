"""XTTS v2's parts against coqui-tts 0.28.0 (goldens, conftest.py): the clip's conditioning (GPT latents and
speaker embedding), the text's token ids, the GPT's codes (greedy and seeded) and the whole waveform
(``Xtts.inference``) within one 16-bit step; request fields the model cannot take refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.xtts.config import checkpoint_defaults, parse_params, text_language
from omnistage.stages.ar.sampling import request_generator
from tests.models.xtts.conftest import CASES, golden, text_ids, within_one_step

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(xtts_dir):
    from omnistage.models.xtts.model import XttsModel

    return XttsModel(xtts_dir)


@pytest.fixture(scope="module")
def voice(model, clip):
    return model.conditioning(*clip)


def generate(model, voice, xtts_dir, text, language, params):
    """One request alone through the model's prefill and steps: its codes and latents."""
    p = parse_params(params, checkpoint_defaults(xtts_dir), model.args.max_new_codes)
    row = model.new_row(p, request_generator(p.sampling.temperature, p.seed))
    [(code, latent)] = model.prefill([row], [(voice[0], model.text_ids(text, language))])
    codes, latents = [code], [latent]
    while codes[-1] != model.args.stop_audio_token and len(codes) < p.max_tokens:
        [(code, latent)] = model.step([row])
        codes.append(code)
        latents.append(latent)
    return codes, torch.stack(latents)


def test_conditioning_equals_the_reference(voice):
    ref = golden("conditioning")
    # measured 0.0 (the same float32 ops); 1e-5 allows another CPU's kernels
    np.testing.assert_allclose(voice[0].numpy(), ref["cond"], atol=1e-5)
    np.testing.assert_allclose(voice[1].numpy(), ref["speaker"], atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_text_ids_equal_the_reference(model, name):
    text, language, _, _ = CASES[name]
    assert model.text_ids(text, language) == text_ids()[name]


@pytest.mark.parametrize("name", ["greedy_en", "sampled_en", "slow_en"])
def test_codes_and_whole_waveform_equal_the_reference(model, voice, xtts_dir, name):
    text, language, params, speed = CASES[name]
    codes, latents = generate(model, voice, xtts_dir, text, language, params)
    ref = golden(f"whole_{name}")
    assert codes == ref["codes"].tolist()
    within_one_step(model.decode(latents, voice[1], speed).numpy(), ref["pcm"])


@pytest.mark.parametrize(
    "params, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 1.5}, "top_k"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10_000}, "max_tokens"),
        ({"seed": -3}, "seed"),
        ({"min_p": 0.1}, "min_p"),
    ],
)
def test_params_are_refused_by_name(xtts_dir, params, field):
    with pytest.raises(InvalidRequestError) as e:
        parse_params(params, checkpoint_defaults(xtts_dir), 27).seed  # noqa: B018
    assert e.value.field == field


def test_languages(model):
    langs = model.args.languages
    assert len(langs) == 17 and text_language("ES", langs) == "es" and text_language("pt-BR", langs) == "pt"
    with pytest.raises(InvalidRequestError) as e:
        text_language("klingon", langs)
    assert e.value.field == "language"
    assert model.text_ids("call me at 5", "en") == model.text_ids("call me at five", "en")  # spelt out (test_text.py)
