"""`omnistage serve` as a real subprocess with the tiny model families, driven
by the official openai client. SD3 images must equal diffusers' own
``StableDiffusion3Pipeline.__call__`` for the same seed; the chat family must
stream the same text it returns whole, and over /v1/realtime say what its chat route says."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from omnistage.testing.server import ServeProcess
from tests.e2e.servers import serve_tiny
from tests.server.realtime_client import chat_stream, next_event, openai_client, read_reply

pytestmark = pytest.mark.slow

KEY = "sk-any"  # the servers ask for none; the realtime client sends one
THINK = 12


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


@pytest.fixture(scope="module")
def sd3_server(tiny_model, tmp_path_factory):
    folder = tiny_model("sd3")
    log = tmp_path_factory.mktemp("sd3log") / "server.log"
    server = ServeProcess.launch([str(folder), "--served-model-name", "tiny-sd3", "--api-key", "k"], log)
    yield folder, server.url
    server.stop()


def test_sd3_images_equal_diffusers_call(sd3_server):
    from diffusers import StableDiffusion3Pipeline

    folder, url = sd3_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny-sd3"]
    resp = client.images.generate(
        model="tiny-sd3", prompt="a red cat", size="32x32", n=2, extra_body={"seed": 3, "num_inference_steps": 2}
    )
    got = [decode(d.b64_json) for d in resp.data]
    torch.set_num_threads(1)
    pipe = StableDiffusion3Pipeline.from_pretrained(folder)
    ref = pipe(
        "a red cat",
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=7.0,
        num_images_per_prompt=2,
        generator=torch.Generator().manual_seed(3),
    )
    assert [g.shape for g in got] == [(32, 32, 3)] * 2
    for g, r in zip(got, ref.images):
        assert np.array_equal(g, np.asarray(r))


def test_sd3_edit_and_chat_image(sd3_server):
    folder, url = sd3_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (250, 10, 10)).save(buf, format="PNG")
    edited = client.images.edit(
        model="tiny-sd3",
        image=("in.png", buf.getvalue(), "image/png"),
        prompt="a cat",
        size="32x32",
        extra_body={"strength": 0.5, "num_inference_steps": 2, "seed": 1},
    )
    plain = client.images.generate(
        model="tiny-sd3", prompt="a cat", size="32x32", extra_body={"num_inference_steps": 2, "seed": 1}
    )
    e, p = decode(edited.data[0].b64_json), decode(plain.data[0].b64_json)
    assert e.shape == p.shape == (32, 32, 3) and not np.array_equal(e, p)  # the input image was used
    chat = client.chat.completions.create(
        model="tiny-sd3",
        messages=[{"role": "user", "content": "a cat"}],
        extra_body={"size": "32x32", "num_inference_steps": 2, "seed": 1},
    )
    content = chat.choices[0].message.content
    assert content[0]["type"] == "image_url"
    assert np.array_equal(decode(content[0]["image_url"]["url"].split(",", 1)[1]), p)
    r = httpx.post(f"{url}/v1/audio/speech", json={"input": "x"}, headers={"Authorization": "Bearer k"})
    assert r.status_code == 400 and "does not produce audio" in r.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/models").status_code == 401


@pytest.fixture(scope="module")
def chat_server(tiny_model, tmp_path_factory):
    yield from serve_tiny(tiny_model, tmp_path_factory, "chat", "tiny-chat", "--enforce-eager")


@pytest.mark.vllm
def test_chat_family_stream_equals_whole(chat_server):
    url = chat_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny-chat"]
    messages = [{"role": "user", "content": "hello there"}]
    whole = client.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="tiny-chat",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens == 8
    assert whole.choices[0].finish_reason == "length"
    running = list(
        client.chat.completions.create(
            model="tiny-chat",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )
    counts = [c.usage.completion_tokens for c in running if c.choices and c.choices[0].delta.content]
    # The server's running count on every text chunk (the detokenizer may hold text back, so the
    # first chunk can already carry several tokens); the closing usage chunk has the total.
    assert counts and counts == sorted(counts) and 1 <= counts[0] and counts[-1] <= 8
    assert running[-1].usage.completion_tokens == 8
    assert all(c.usage.prompt_tokens == whole.usage.prompt_tokens for c in running if c.usage)


@pytest.mark.vllm
async def test_a_text_chat_model_over_realtime_says_what_its_chat_route_says(chat_server):
    async with openai_client(chat_server, KEY).realtime.connect(model="tiny-chat") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.output_modalities == ["text"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]}, event_id="speak")
        err = (await next_event(conn, "error")).error
        assert (err.param, err.event_id) == ("session.output_modalities", "speak")
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "You are terse.",
                "max_output_tokens": THINK,
                "extra_body": {"temperature": 0},
            }
        )
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello, who are you?"}]}
        )
        await conn.response.create()
        reply = await read_reply(conn)
    text, pcm = chat_stream(
        chat_server,
        KEY,
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello, who are you?"}],
        max_tokens=THINK,
        temperature=0,
    )
    assert reply.text == text and reply.text_done == text and text and pcm == b"" == reply.pcm
    assert reply.status in ("completed", "incomplete") and 0 < reply.done.response.usage.output_tokens <= THINK
