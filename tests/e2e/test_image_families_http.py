"""The family harness over HTTP: each row of tests/models/image_families.py sends its ``http`` request with
the official openai client (``images.generate``) and the PNGs must be within one uint8 level of diffusers'
own ``__call__`` for the same seed. One server per family for the session (``family_server``), shared with
the family's own HTTP module."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from tests.models.image_families import FAMILIES, by_name

pytestmark = pytest.mark.slow


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


@pytest.mark.parametrize("name", [f.name for f in FAMILIES])
def test_generate_equals_diffusers_call(name, family_server):
    import diffusers

    fam = by_name(name)
    folder, client = family_server(name)
    req = fam.http
    resp = client.images.generate(model=f"tiny-{name}", prompt=req.prompt, **req.http_body(fam))
    torch.set_num_threads(1)
    ref = getattr(diffusers, fam.diffusers_class).from_pretrained(folder)
    ref.set_progress_bar_config(disable=True)
    want = ref(prompt=req.prompt, **req.diffusers_kwargs(fam)).images
    got = [decode(d.b64_json) for d in resp.data]
    assert len(got) == len(want) == req.n
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape == (fam.size["height"], fam.size["width"], 3)
        assert int(np.abs(g.astype(int) - w.astype(int)).max()) <= 1
