"""LoRA adapters over HTTP on the tiny SD3, configured by ``omnistage serve``'s own flags (``--lora-modules``,
``--max-loras``, ``--max-lora-rank``, ``--allow-runtime-lora-updating``) and served in this process:
``/v1/models`` lists the adapters with the base model as parent; ``model`` selects one on the image routes
(``lora_scale`` in ``extra_body``) and the PNGs equal diffusers with ``load_lora_weights`` within one uint8
level, also for requests with other adapters and none running together; runtime load / unload behave as
``vllm serve``'s; bad input is a 4xx naming the field."""

from __future__ import annotations

import argparse
import base64
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omnistage import AsyncOmni
from omnistage.cli import serve as serve_cli
from omnistage.cli import serve_config
from omnistage.models.flux.tiny import build_lora as build_flux_lora
from omnistage.models.sd3.tiny import build_lora
from omnistage.testing.server import serve_engine

pytestmark = pytest.mark.slow
NAME = "tiny-sd3"
FAST = {"num_inference_steps": 3, "guidance_scale": 5.0}


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def within_one_level(got: np.ndarray, want: Image.Image) -> bool:
    want = np.asarray(want)
    return got.shape == want.shape and int(np.abs(got.astype(int) - want.astype(int)).max()) <= 1


@pytest.fixture(scope="module")
def paths(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("http-loras")
    build_lora(root / "b", seed=1, rank=2, alpha=1.0)
    build_lora(root / "c", seed=2, rank=3, alpha=6.0)
    build_lora(root / "wide", seed=3, rank=16, alpha=16.0)
    build_flux_lora(root / "flux")
    return {
        "model": str(tiny_model("sd3")),
        "a": str(tiny_model("sd3_lora")),
        **{k: str(root / k) for k in ("b", "c", "wide", "flux")},
    }


def serve_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


@pytest.fixture(scope="module")
def server(paths):
    args = serve_args(
        [
            paths["model"],
            "--lora-modules",
            f"a={paths['a']}",
            f'{{"name": "b", "path": "{paths["b"]}"}}',
            "--max-loras",
            "3",
            "--max-lora-rank",
            "8",
            "--allow-runtime-lora-updating",
            "--served-model-name",
            NAME,
        ]
    )
    engine = AsyncOmni(args.model, **serve_config.with_lora_flags(args.model, serve_config.engine_kwargs(args), args))
    assert engine.deploy.stage(0).max_loras == 3 and [m.name for m in engine.deploy.stage(0).lora_modules] == ["a", "b"]
    with serve_engine(
        engine, served_model_name=args.served_model_name, allow_runtime_lora_updating=args.allow_runtime_lora_updating
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def ref(paths):
    import diffusers

    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(paths["model"])
    pipe.set_progress_bar_config(disable=True)
    for name in ("a", "b", "c"):
        pipe.load_lora_weights(paths[name], adapter_name=name)
    return pipe


def expected(ref, prompt: str, lora: str | None, scale: float, seed: int, steps: int = 3) -> Image.Image:
    torch.set_num_threads(1)
    kw = dict(
        height=32,
        width=32,
        num_inference_steps=steps,
        guidance_scale=5.0,
        generator=torch.Generator().manual_seed(seed),
    )
    if lora is None:
        ref.disable_lora()
        try:
            return ref(prompt, **kw).images[0]
        finally:
            ref.enable_lora()
    ref.set_adapters(lora)
    return ref(prompt, joint_attention_kwargs={"scale": scale}, **kw).images[0]


def generate(client, model: str, prompt: str, seed: int, scale: float | None = None, steps: int = 3) -> np.ndarray:
    extra = {**FAST, "num_inference_steps": steps, "seed": seed, **({"lora_scale": scale} if scale is not None else {})}
    resp = client.images.generate(model=model, prompt=prompt, size="32x32", extra_body=extra)
    return decode(resp.data[0].b64_json)


def test_models_lists_the_adapters(server, paths):
    with server.client() as c:
        data = c.get("/v1/models").json()["data"]
        assert [m["id"] for m in data] == [NAME, "a", "b"]
        for m in data[1:]:
            assert m["parent"] == NAME and m["root"] == paths[m["id"]] and m["object"] == "model"
            assert "images.generations" in m["routes"]
        assert c.get("/v1/models/a").json()["parent"] == NAME
        assert c.get("/v1/models/nope").status_code == 404


def test_mixed_adapters_equal_diffusers(server, client, ref):
    jobs = [
        ("a", "a red cat", 1.0, 1),
        ("b", "green square", 0.5, 2),
        (NAME, "blue chair", None, 3),
        ("a", "city skyline", 0.3, 4),
    ]
    engine = server.engine.replicas(0)[0]
    engine.forward_log.clear()
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda j: generate(client, j[0], j[1], j[3], j[2]), jobs))
    assert max(len(ids) for _, ids in engine.forward_log) >= 2  # adapters shared forwards
    for (model, prompt, scale, seed), image in zip(jobs, got):
        lora = None if model == NAME else model
        assert within_one_level(image, expected(ref, prompt, lora, 1.0 if scale is None else scale, seed)), model
    assert not within_one_level(got[0], expected(ref, "a red cat", None, 1.0, 1))  # the adapter shows


def test_edits_and_chat_take_the_adapter(server, client, ref):
    """Image edits (diffusers' img2img pipeline on the same LoRA-loaded components) and chat (an image back)."""
    import diffusers

    src = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    buf = io.BytesIO()
    src.save(buf, format="PNG")
    resp = client.images.edit(
        model="a",
        image=("in.png", buf.getvalue(), "image/png"),
        prompt="a red cat",
        size="32x32",
        extra_body={**FAST, "seed": 5, "strength": 0.8, "lora_scale": 0.5},
    )
    img2img = diffusers.StableDiffusion3Img2ImgPipeline.from_pipe(ref)
    ref.set_adapters("a")
    want = img2img(
        "a red cat",
        image=src,
        strength=0.8,
        height=32,
        width=32,
        generator=torch.Generator().manual_seed(5),
        joint_attention_kwargs={"scale": 0.5},
        **FAST,
    ).images[0]
    assert within_one_level(decode(resp.data[0].b64_json), want)
    with server.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": "a",
                "messages": [{"role": "user", "content": "a red cat"}],
                "size": "32x32",
                "seed": 5,
                **FAST,
            },
        )
    assert r.status_code == 200, r.text
    (part,) = [p for p in r.json()["choices"][0]["message"]["content"] if p["type"] == "image_url"]
    got = decode(part["image_url"]["url"].split(",", 1)[1])
    assert within_one_level(got, expected(ref, "a red cat", "a", 1.0, 5))


def test_unknown_model_is_a_404_naming_it(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.images.generate(model="nope", prompt="a cat", size="32x32", extra_body=FAST)
    assert e.value.body["param"] == "model" and "'nope'" in e.value.body["message"]


def test_runtime_load_and_bad_adapters(server, client, ref, paths):
    with server.client() as c:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": paths["c"]})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'c' added successfully.")
        assert within_one_level(generate(client, "c", "a red cat", 9, 0.8), expected(ref, "a red cat", "c", 0.8, 9))
        cases = [
            ({"lora_name": "c", "lora_path": paths["c"]}, "lora_name", "already been loaded"),
            ({"lora_name": NAME, "lora_path": paths["c"]}, "lora_name", "conflicts with a served base model"),
            ({"lora_name": "x", "lora_path": paths["c"] + "-missing"}, "lora_path", "does not exist"),
            ({"lora_name": "x", "lora_path": paths["flux"]}, "lora_path", "another base model"),
            (
                {"lora_name": "x", "lora_path": paths["wide"]},
                "lora_path",
                "rank 16, above this server's max_lora_rank of 8",
            ),
            ({"lora_name": "x"}, "lora_path", "field required"),
        ]
        for body, param, message in cases:
            r = c.post("/v1/load_lora_adapter", json=body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["param"] == param and message in r.json()["error"]["message"], r.json()
        # max_loras=3: a, b and c are loaded
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "d", "lora_path": paths["b"]})
        assert r.status_code == 400 and "max_loras=3" in r.json()["error"]["message"]
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [NAME, "a", "b", "c"]


def test_unload_while_running_lets_it_finish(server, client, ref, paths):
    STEPS = 150  # long enough to still run when the unload comes
    with server.client() as c:
        if c.get("/v1/models/c").status_code == 404:
            assert c.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": paths["c"]}).status_code == 200
        engine = server.engine.replicas(0)[0]
        result: dict = {}

        def long_request() -> None:
            result["image"] = generate(client, "c", "a red cat", 21, 1.0, steps=STEPS)

        thread = threading.Thread(target=long_request)
        thread.start()
        deadline = time.monotonic() + 60
        while not engine.lora.users("c") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.lora.users("c") == 1  # running with the adapter
        r = c.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
        assert (r.status_code, r.text) == (200, "Success: LoRA adapter 'c' removed successfully.")
        assert server.engine.running_requests(0)  # unloaded while the request was still running
        with pytest.raises(openai.NotFoundError) as e:  # later requests: 404 naming the model
            client.images.generate(model="c", prompt="a cat", size="32x32", extra_body=FAST)
        assert e.value.body["param"] == "model" and "'c'" in e.value.body["message"]
        thread.join(120)
        assert "image" in result  # the running one finished, with the adapter
        assert within_one_level(result["image"], expected(ref, "a red cat", "c", 1.0, 21, steps=STEPS))
        r = c.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name"
        assert c.post("/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": paths["c"]}).status_code == 200


def test_runtime_updates_disabled_is_a_404(paths):
    engine = AsyncOmni(paths["model"], stage_overrides={"0": {"lora_modules": [f"a={paths['a']}"]}})
    with serve_engine(engine, served_model_name=NAME) as srv, srv.client() as c:
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            assert c.post(path, json={"lora_name": "x", "lora_path": paths["b"]}).status_code == 404
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == [NAME, "a"]


def test_runtime_updates_need_lora_stages(paths):
    with pytest.raises(ValueError, match="--allow-runtime-lora-updating: no stage takes LoRA adapters"):
        serve_engine(AsyncOmni(paths["model"]), allow_runtime_lora_updating=True)
    args = serve_args([paths["model"], "--lora-modules", "bad"])
    with pytest.raises(ValueError, match="--lora-modules: 'bad'"):
        serve_config.with_lora_flags(args.model, serve_config.engine_kwargs(args), args)
