"""The naive baseline server is the real diffusers pipeline behind HTTP: its image
equals the pipeline's own ``__call__`` with the same seed, and bad input is a 400."""

import base64
import importlib.util
import io
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from omnistage.testing.server import serve_app

ROOT = Path(__file__).resolve().parents[2]


def load_baseline():
    path = ROOT / "benchmarks" / "baselines" / "naive_diffusers_server.py"
    spec = importlib.util.spec_from_file_location("naive_diffusers_server", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pipe(tiny_model):
    import torch
    from diffusers import DiffusionPipeline

    p = DiffusionPipeline.from_pretrained(tiny_model("sd3"), dtype=torch.float32)
    p.set_progress_bar_config(disable=True)
    return p


def test_naive_server_matches_pipeline_call(pipe):
    import torch

    naive = load_baseline()
    with serve_app(naive.create_app(pipe, "tiny-sd3")) as srv:
        url = srv.url
        body = {"prompt": "a red square", "size": "32x32", "num_inference_steps": 3, "seed": 11, "guidance_scale": 2.0}
        resp = httpx.post(url + "/v1/images/generations", json=body, timeout=120)
        assert resp.status_code == 200
        got = np.asarray(Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"]))))

        bad = httpx.post(url + "/v1/images/generations", json={"prompt": "x", "size": "big"}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "size"
        missing = httpx.post(url + "/v1/images/generations", json={"size": "32x32"}, timeout=30)
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"

    ref = pipe(
        prompt="a red square",
        height=32,
        width=32,
        num_inference_steps=3,
        guidance_scale=2.0,
        generator=torch.Generator().manual_seed(11),
    ).images[0]
    assert got.shape == (32, 32, 3)
    assert np.array_equal(got, np.asarray(ref))
