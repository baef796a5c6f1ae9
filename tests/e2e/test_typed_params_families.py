"""Typed parameters keep each family's defaults: on every registered diffusion family's tiny folder, one request
written three ways gives the same output — offline as a typed ``DiffusionSamplingParams``, offline as a dict,
and over HTTP as a body. Each request leaves ``guidance_scale`` (and the rest) unset, so it runs at the family's
default (LTX-2's 3.0, FLUX's 3.5, ...) and not at the class's 7.0, whichever way it is written.

Images come back as PNG (lossless); videos as MP4, so the offline frames are encoded the same way and both
decoded before they are compared."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from omnistage import AsyncOmni, Omni
from omnistage.params import DiffusionSamplingParams
from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.stages.diffusion.helpers import noise_image
from tests.video_http import decode_mp4

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Row:
    tiny: str  # the tiny fixture (its folder resolves to the family's pipeline)
    size: tuple[int, int] | None  # (width, height); None: the family takes it from the input image
    frames: int | None = None  # a video family: its frame count
    edit: tuple[int, int] | None = None  # an edit family: the input image's (height, width)
    extra: dict[str, Any] = field(default_factory=dict)  # standard knobs or declared extras the row needs


ROWS = [
    Row("sd3", (48, 32)),
    Row("sd15", (48, 32)),
    Row("sdxl", (48, 32)),
    Row("flux", (48, 32), extra={"max_sequence_length": 32}),
    Row("flux_schnell", (48, 32)),
    Row("flux_kontext", (32, 32), edit=(32, 32)),
    Row("z_image", (48, 32)),
    Row("qwen_image", (48, 32)),
    Row("qwen_image_edit", (64, 64), edit=(32, 32)),
    Row("qwen_image_edit_plus", (64, 64), edit=(32, 32)),
    Row("qwen_image_21", (96, 64)),
    Row("pixart_sigma", (48, 32), extra={"use_resolution_binning": False}),
    Row("sana", (96, 64), extra={"use_resolution_binning": False}),
    Row("flux2", (48, 32), extra={"max_sequence_length": 64}),
    Row("flux2_klein", (48, 32), extra={"max_sequence_length": 32}),
    Row("ovis_image", (48, 32), extra={"max_sequence_length": 32}),
    Row("longcat_image", (48, 32), extra={"enable_prompt_rewrite": False}),
    Row("longcat_image_edit", None, edit=(32, 32)),
    Row("qwen_image_layered", None, edit=(32, 32), extra={"layers": 1}),  # one RGBA layer: one picture each way
    Row("ernie_image", (48, 32)),  # its prompt enhancer on (the default): the rewrite is seeded like the picture
    Row("wan", (48, 32), frames=9),
    Row("ltx2", (64, 32), frames=9),
    Row("ltx23", (64, 32), frames=9, extra={"max_sequence_length": 16}),  # the LTX-2.3 layout
    Row("hunyuan_video15", (32, 16), frames=5),
    Row("helios", (32, 32), frames=65),  # two chunks: the shortest length Helios makes
    Row("cosmos3", (48, 32), frames=9),
    Row("wan_vace", (48, 32), frames=9, extra={"max_sequence_length": 16}),  # no source video: the zero one
]
STANDARD = set(DiffusionSamplingParams.model_fields)


@pytest.fixture(scope="module", params=ROWS, ids=lambda r: r.tiny)
def family(request, tiny_model):
    row: Row = request.param
    folder = str(tiny_model(row.tiny))
    offline = Omni(folder)
    srv = serve_engine(AsyncOmni(folder), served_model_name="tiny")
    yield row, offline, srv.url
    srv.stop()
    offline.close()


def _png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def test_typed_dict_and_http_give_the_same_output(family):
    row, offline, url = family
    params: dict[str, Any] = {"seed": 3, "num_inference_steps": 2}
    if row.size is not None:
        params.update(width=row.size[0], height=row.size[1])
    if row.frames is not None:
        params["num_frames"] = row.frames
    standard = {k: v for k, v in row.extra.items() if k in STANDARD}
    extras = {k: v for k, v in row.extra.items() if k not in STANDARD}
    params.update(standard)
    prompt: dict[str, Any] = {"prompt": "a red cat on a chair"}
    source = noise_image(*row.edit, 1) if row.edit else None
    if source is not None:
        prompt["multi_modal_data"] = {"image": [source]}

    typed = DiffusionSamplingParams(**params, extra_args=extras)
    assert "guidance_scale" not in typed.model_fields_set  # the family's default must fill it
    [by_type] = offline.generate(prompt, [typed], use_tqdm=False)
    [by_dict] = offline.generate(prompt, [{**params, "extra_args": extras}], use_tqdm=False)
    assert by_type.error is None and by_dict.error is None, (by_type.error, by_dict.error)

    body = {k: v for k, v in params.items() if k not in ("width", "height")}
    body.update(model="tiny", prompt=prompt["prompt"], **extras)
    if row.size is not None:
        body["size"] = f"{row.size[0]}x{row.size[1]}"
    if row.frames is not None:
        fps = int(by_type.fps)
        r = httpx.post(f"{url}/v1/videos/sync", json={**body, "fps": fps}, timeout=600)
        assert r.status_code == 200, r.text
        got = decode_mp4(r.content)["frames"]
        for out in (by_type, by_dict):
            want = decode_mp4(encode_mp4(out.video, fps))["frames"]
            np.testing.assert_array_equal(got, want)
        return
    if source is not None:
        form = {k: str(v) for k, v in body.items()}
        r = httpx.post(
            f"{url}/v1/images/edits", data=form, files={"image": ("a.png", _png(source), "image/png")}, timeout=600
        )
    else:
        r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=600)
    assert r.status_code == 200, r.text
    got = [np.asarray(Image.open(io.BytesIO(base64.b64decode(d["b64_json"]))).convert("RGB")) for d in r.json()["data"]]
    for out in (by_type, by_dict):
        want = [np.asarray(im.convert("RGB")) for im in out.images]
        assert len(got) == len(want) == 1
        np.testing.assert_array_equal(got[0], want[0])
