"""OmniVoice's code generator against k2-fsa's ``omnivoice`` package (its goldens): the prompt's ids and the
unmasked codes of one request equal the reference's bit for bit, alone and batched with other requests of
other lengths and steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.models.omnivoice.conftest import CASES, request_of


@pytest.mark.parametrize("name", CASES)
def test_prompt_equals_reference(omnivoice_lm, name):
    """Style tokens, the joined text, the reference clip's codes and the masked target, as the package
    builds them (its first codebook's row)."""
    request, g = request_of(omnivoice_lm, name)
    np.testing.assert_array_equal(request.prompt[0].numpy(), g["prompt_ids"])
    audio = int(g["target_len"]) + (g["ref_codes"].shape[-1] if "ref_codes" in g else 0)
    assert request.audio_start == request.prompt.shape[1] - audio


@pytest.mark.parametrize("name", CASES)
def test_codes_equal_reference(omnivoice_lm, name):
    request, g = request_of(omnivoice_lm, name)
    (codes,) = omnivoice_lm.generate([request])
    np.testing.assert_array_equal(codes.numpy(), g["codes"])


def test_batched_requests_equal_reference(omnivoice_lm):
    """Four requests of different lengths, step counts and prompts in shared forwards, one of them joining
    after the others have run a few steps: each equals its reference."""
    requests = {name: request_of(omnivoice_lm, name) for name in CASES}
    first = [requests[n][0] for n in ("auto", "design", "duration")]
    for _ in range(3):
        omnivoice_lm.step(first)
    live = [*first, requests["clone"][0]]
    while live:
        omnivoice_lm.step(live)
        live = [r for r in live if not r.done]
    for name, (request, g) in requests.items():
        np.testing.assert_array_equal(request.codes.numpy(), g["codes"], err_msg=name)


def test_another_seed_changes_codes(omnivoice_lm):
    """The position noise is the request's own: another seed unmasks in another order."""
    request, g = request_of(omnivoice_lm, "duration", seed=12345)
    (codes,) = omnivoice_lm.generate([request])
    assert not torch.equal(codes, torch.from_numpy(g["codes"]))
