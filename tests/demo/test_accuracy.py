"""Does the shipped demo model draw what it is asked? 24 prompts (every colour at every
position, shapes rotating) through the HTTP server; a simple analyser checks the colour of
the largest non-background region and its horizontal position. The figure goes to
test-artifacts/demo-accuracy.json (and, by hand, into demo/RESULTS.md and the README)."""

import asyncio
import base64
import io
import json

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.demo.analyser import PALETTE, analyse
from tests.demo.conftest import ARTIFACTS

PHRASES = {"left": "on the left", "center": "in the center", "right": "on the right"}
SHAPES = ("circle", "square", "triangle")
CASES = [(colour, SHAPES[(i + j) % 3], position)
         for i, colour in enumerate(PALETTE) for j, position in enumerate(PHRASES)]
REQUIRED = 0.8


@pytest.mark.slow
async def test_demo_draws_the_requested_colour_and_position(demo_server):
    assert len(CASES) == 24

    async with httpx.AsyncClient(base_url=demo_server, timeout=300) as client:
        async def one(k: int, colour: str, shape: str, position: str) -> np.ndarray:
            resp = await client.post("/v1/images/generations", json={
                "prompt": f"a {colour} {shape} {PHRASES[position]}", "size": "64x64", "seed": 1000 + k,
                "response_format": "b64_json"})
            assert resp.status_code == 200, resp.text
            return np.asarray(Image.open(io.BytesIO(base64.b64decode(resp.json()["data"][0]["b64_json"]))).convert("RGB"))

        images = await asyncio.gather(*(one(k, *case) for k, case in enumerate(CASES)))

    rows, hits = [], 0
    for (colour, shape, position), image in zip(CASES, images):
        got = analyse(image)
        ok = got["colour"] == colour and got["position"] == position
        hits += ok
        rows.append({"prompt": f"a {colour} {shape} {PHRASES[position]}", "colour": got["colour"],
                     "position": got["position"], "ok": ok})
    accuracy = hits / len(CASES)

    ARTIFACTS.mkdir(exist_ok=True)
    sheet = np.concatenate([np.concatenate(images[r * 6:(r + 1) * 6], axis=1) for r in range(4)], axis=0)
    Image.fromarray(sheet).resize((sheet.shape[1] * 2, sheet.shape[0] * 2), Image.NEAREST).save(
        ARTIFACTS / "demo-accuracy.png")
    (ARTIFACTS / "demo-accuracy.json").write_text(json.dumps({
        "accuracy": accuracy, "colour_accuracy": np.mean([r["colour"] == c for r, (c, _, _) in zip(rows, CASES)]),
        "position_accuracy": np.mean([r["position"] == p for r, (_, _, p) in zip(rows, CASES)]),
        "cases": rows}, indent=2, default=float))
    misses = [r for r in rows if not r["ok"]]
    assert accuracy >= REQUIRED, f"accuracy {accuracy:.0%} < {REQUIRED:.0%}; misses: {misses}"
