"""Naive text-to-image server: what users build today around a diffusers pipeline.

FastAPI, one pipeline, ``pipe(...)`` called per request under a lock (the
pipeline is not safe to call concurrently), same ``/v1/images/generations``
shape as omnistage (docs/server.md). Baseline for ``benchmarks/run_all.sh``.

    python benchmarks/baselines/naive_diffusers_server.py MODEL_DIR --port 8100 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def _error(message: str, param: str | None, status: int = 400) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": status}},
        status_code=status,
    )


def parse_request(body: Any) -> dict[str, Any]:
    """Validate an images/generations body; ValueError names the bad field (as ``field: msg``)."""
    if not isinstance(body, dict):
        raise ValueError("body: must be a JSON object")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt: must be a non-empty string")
    kw: dict[str, Any] = {"prompt": prompt}
    n = body.get("n", 1)
    if not isinstance(n, int) or not 1 <= n <= 8:
        raise ValueError("n: must be an integer in 1..8")
    kw["num_images_per_prompt"] = n
    if body.get("size") is not None:
        try:
            w, h = (int(x) for x in str(body["size"]).lower().split("x"))
        except ValueError:
            raise ValueError("size: must look like 'WIDTHxHEIGHT'") from None
        if not (8 <= w <= 4096 and 8 <= h <= 4096):
            raise ValueError("size: width and height must be in 8..4096")
        kw.update(width=w, height=h)
    for key, typ in (("num_inference_steps", int), ("guidance_scale", (int, float)), ("seed", int)):
        value = body.get(key)
        if value is not None and (not isinstance(value, typ) or isinstance(value, bool)):
            raise ValueError(f"{key}: wrong type")
        if value is not None:
            kw[key] = value
    if kw.get("num_inference_steps", 1) < 1:
        raise ValueError("num_inference_steps: must be >= 1")
    if body.get("negative_prompt") is not None:
        if not isinstance(body["negative_prompt"], str):
            raise ValueError("negative_prompt: must be a string")
        kw["negative_prompt"] = body["negative_prompt"]
    if body.get("response_format", "b64_json") != "b64_json":
        raise ValueError("response_format: only b64_json is supported")
    return kw


def generate(pipe, kw: dict[str, Any]) -> list[bytes]:
    import torch

    kw = dict(kw)
    seed = kw.pop("seed", None)
    if seed is not None:
        kw["generator"] = torch.Generator().manual_seed(seed)
    images = pipe(**kw).images
    out = []
    for image in images:
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def create_app(pipe, model_name: str) -> FastAPI:
    app = FastAPI(title="naive diffusers server")
    lock = asyncio.Lock()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "naive"}]}

    @app.post("/v1/images/generations")
    async def images(request: Request):
        try:
            kw = parse_request(await request.json())
        except ValueError as e:
            field = str(e).split(":", 1)[0]
            return _error(str(e), field)
        async with lock:  # one pipeline call at a time, in a worker thread
            try:
                pngs = await asyncio.to_thread(generate, pipe, kw)
            except Exception as e:  # a bad combination diffusers rejects must not kill the server
                return _error(f"generation failed: {e}", None, 500)
        return {"created": int(time.time()), "data": [{"b64_json": base64.b64encode(p).decode()} for p in pngs]}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--served-model-name", default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import uvicorn
    from diffusers import DiffusionPipeline

    torch.set_num_threads(args.threads)
    pipe = DiffusionPipeline.from_pretrained(args.model, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    app = create_app(pipe, args.served_model_name or args.model)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
