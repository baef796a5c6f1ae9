"""The media intake without a model (the fast half of the media matrix, tests/e2e/media_matrix.py): every awkward
image the server decodes equals diffusers' ``load_image`` of it, pixel for pixel; every awkward audio file
decodes to the samples the test's own soundfile / PyAV decode and soxr HQ resampling give, bit for bit."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from omnistage.media.audio import decode_audio
from omnistage.media.limits import MediaLimits
from omnistage.server.media import image_from_bytes
from tests.e2e import media_matrix as mm


@pytest.mark.parametrize("name", sorted(mm.IMAGES))
def test_each_image_decodes_as_diffusers_load_image(name):
    from diffusers.utils import load_image
    from PIL import Image

    data = mm.IMAGES[name]()
    got = image_from_bytes(data, "image", MediaLimits())
    want = load_image(Image.open(io.BytesIO(data)))
    assert got.mode == "RGB" and np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("name", sorted(mm.AUDIO))
@pytest.mark.parametrize("rate", [16000, 24000])
def test_each_audio_decodes_to_its_content_at_the_model_rate(name, rate):
    data = mm.AUDIO[name]()
    want, want_rate = soundfile.read(io.BytesIO(mm.model_form_audio(data, rate)), dtype="float32")
    got = decode_audio(data, "file", rate, 60.0)
    assert want_rate == rate and got.dtype == np.float32 and np.array_equal(got, want)
