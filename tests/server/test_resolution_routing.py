"""The requested output size reaches stages upstream of the denoiser through the family's declared
request hook (GLM-Image's AR stage draws its image tokens on the target grid; llm params cannot carry it):
the same hook GLM-Image declares, on a pipeline of the same shape."""

from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.glm_image.edges import size_for_ar_stage
from omnistage.pipeline import Edge, Pipeline, StageContext, StageSpec
from omnistage.stages.base import StageOutput, StageRequest, StageStats
from omnistage.stages.generation.engine import GenerationItem

from .conftest import new_engine


class GridTokenEngine:
    """An llm-kind source stage that emits one token id per latent cell of the requested grid."""

    def __init__(self, ctx: StageContext):
        self.stage_id = ctx.spec.stage_id

    async def start(self) -> None:
        pass

    async def generate(self, req: StageRequest):
        size = req.inputs.get("image_size")
        if size is None:
            raise InvalidRequestError("image_size", "the target height/width did not reach the AR stage")
        h, w = size[0] // 8, size[1] // 8
        yield StageOutput(req.request_id, self.stage_id, {"token_ids": list(range(h * w)), "grid": [[h, w]]}, False)
        yield StageOutput(req.request_id, self.stage_id, {}, True, finish_reason="length")

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        pass

    async def abort(self, request_id: str) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    def stats(self) -> StageStats:
        return StageStats()


class TokensToImage:
    """Upsamples a grid of token embeddings to pixels (8x), like a tiny decoder."""

    def __init__(self, ctx: StageContext):
        self.embed = torch.nn.Embedding(4096, 3)

    def run(self, items: list[GenerationItem]) -> list[Any]:
        out = []
        for it in items:
            ((h, w),) = it.inputs["grid"]
            with torch.no_grad():
                x = self.embed(torch.as_tensor(it.inputs["token_ids"])).reshape(h, w, 3)
            pixels = (x.sigmoid() * 255).to(torch.uint8).repeat_interleave(8, 0).repeat_interleave(8, 1)
            out.append({"image": [np.ascontiguousarray(pixels.numpy())]})
        return out


def tokens_to_prior(outputs: dict[str, Any], request: Any) -> dict[str, Any]:
    return {"token_ids": outputs["token_ids"], "grid": outputs["grid"]}


PIPELINE = Pipeline(
    "test_ar_grid",
    [
        StageSpec(0, kind="llm", engine=GridTokenEngine, output="token_ids"),
        StageSpec(
            1,
            kind="generation",
            adapter=TokensToImage,
            output="image",
            final=True,
            inputs=[Edge(0, process=tokens_to_prior)],
        ),
    ],
    shape_request=size_for_ar_stage,
)


def test_size_reaches_the_ar_stage(server_factory):
    srv = server_factory(new_engine(PIPELINE))
    with srv.client() as http:
        r = http.post("/v1/images/generations", json={"prompt": "x", "size": "48x24"})
        assert r.status_code == 200, r.text
        from base64 import b64decode
        from io import BytesIO

        from PIL import Image

        assert Image.open(BytesIO(b64decode(r.json()["data"][0]["b64_json"]))).size == (48, 24)
        r = http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "height": 16, "width": 32}
        )
        assert r.status_code == 200, r.text
        r = http.post("/v1/images/generations", json={"prompt": "x"})  # no size: the AR stage says so
        assert r.status_code == 400 and "image_size" in r.json()["error"]["message"]
