"""What a newcomer meets on the demo server, through the official ``openai`` client: the model card
says what the demo can draw (its words, example prompts, the sizes it draws, up to its own limit), and a prompt
with words it was not trained on, or a size it was not trained at, is answered with a warning, in a header and in
the body, not silently."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from PIL import Image

from omnistage.models.demo.vocabulary import EXAMPLE_PROMPTS, VOCABULARY

pytestmark = pytest.mark.slow

FAST = {"num_inference_steps": 2, "seed": 1}


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=f"{demo_server}/v1", api_key="none", max_retries=0, timeout=120)


def test_the_card_lists_the_words_prompts_and_sizes(client, demo_server):
    card = httpx.get(f"{demo_server}/v1/models").json()["data"][0]
    assert card["id"] == client.models.list().data[0].id == "omnistage-demo"
    assert card["vocabulary"] == VOCABULARY and card["example_prompts"] == EXAMPLE_PROMPTS
    assert "left, center, right" in card["description"]
    # VAE factor 4 x patch 1; 64 patches of positional embedding: up to 256 a side; native 64
    assert card["image_sizes"] == {
        "native": "64x64",
        "max_side": 256,
        "multiple": 4,
        "choices": ["32x32", "64x64", "128x128", "256x256"],
    }


def test_the_listed_limit_is_the_models_own(client):
    """The largest size offered is drawn; one step past it is refused by the model's own check, naming the field."""
    out = client.images.generate(
        model="omnistage-demo",
        prompt=EXAMPLE_PROMPTS[0],
        size="256x256",
        extra_body={"num_inference_steps": 1, "seed": 1},
    )
    assert Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json))).size == (256, 256)
    with pytest.raises(openai.BadRequestError) as e:
        client.images.generate(
            model="omnistage-demo", prompt=EXAMPLE_PROMPTS[0], size="260x260", extra_body={"num_inference_steps": 1}
        )
    assert "256" in str(e.value) and e.value.body["param"] in ("size", "height", "width"), e.value.body


def test_a_prompt_it_cannot_draw_gets_a_warning(client):
    raw = client.images.with_raw_response.generate(
        model="omnistage-demo", prompt="a yellow circle at the top", size="64x64", extra_body=FAST
    )
    assert raw.status_code == 200
    header = raw.headers.get("x-omnistage-warning")
    assert header and "'top'" in header and "position: left, center, right" in header, header
    body = raw.http_response.json()
    assert body["warnings"] == [header] and len(body["data"]) == 1
    assert raw.parse().data[0].b64_json  # the openai client still reads the answer

    # words it knows, in any case and with punctuation: no warning
    plain = client.images.with_raw_response.generate(
        model="omnistage-demo", prompt="A Yellow circle, on the left.", size="64x64", extra_body=FAST
    )
    assert "x-omnistage-warning" not in plain.headers and "warnings" not in plain.http_response.json()


def test_a_size_or_background_it_cannot_draw_gets_a_warning(client):
    """256x256 (offered: the weights allow it) and "yellow background" (yellow is a shape colour) still draw,
    each with a warning naming it, in the headers and the body, on the images and the chat routes."""
    raw = client.images.with_raw_response.generate(
        model="omnistage-demo", prompt="a red circle on a yellow background", size="256x256", extra_body=FAST
    )
    headers = raw.headers.get_list("x-omnistage-warning")
    assert raw.http_response.json()["warnings"] == headers and len(headers) == 2, headers
    assert "'yellow background'" in headers[0] and "at 256x256" in headers[1] and "64x64" in headers[1]
    assert Image.open(io.BytesIO(base64.b64decode(raw.parse().data[0].b64_json))).size == (256, 256)

    ask = {
        "model": "omnistage-demo",
        "messages": [{"role": "user", "content": "a red circle on the left"}],
        "extra_body": {**FAST, "height": 128, "width": 128},
    }
    chat = client.chat.completions.with_raw_response.create(**ask)
    [size] = chat.headers.get_list("x-omnistage-warning")
    assert "at 128x128" in size and chat.http_response.json()["warnings"] == [size]
    with client.chat.completions.with_streaming_response.create(**ask, stream=True) as streamed:
        assert streamed.headers.get_list("x-omnistage-warning") == [size]
        assert any(chunk.choices for chunk in streamed.parse())
    native = client.images.with_raw_response.generate(
        model="omnistage-demo", prompt="a red circle on a gray background", size="64x64", extra_body=FAST
    )
    assert "x-omnistage-warning" not in native.headers


def test_warnings_survive_any_characters(demo_server):
    """A header is latin-1: a word in another script is escaped there, kept as it is in the body."""
    r = httpx.post(
        f"{demo_server}/v1/images/generations",
        timeout=120,
        json={"prompt": "a red circle on the left \u2603 \u00e9toile \u661f", "size": "64x64", **FAST},
    )
    assert r.status_code == 200, r.text
    header, [warning] = r.headers["x-omnistage-warning"], r.json()["warnings"]
    assert "'\\xe9toile', '\\u661f'" in header and "'\u00e9toile', '\u661f'" in warning, (header, warning)
    assert httpx.get(f"{demo_server}/health").json()["status"] == "ok"


def test_edits_warn_too(demo_server):
    png = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(png, format="PNG")
    r = httpx.post(
        f"{demo_server}/v1/images/edits",
        timeout=120,
        files={"image": ("in.png", png.getvalue(), "image/png")},
        data={"prompt": "a blue star", "size": "64x64", "num_inference_steps": "2", "strength": "0.6"},
    )
    assert r.status_code == 200, r.text
    assert "'star'" in r.headers["x-omnistage-warning"] and "'star'" in r.json()["warnings"][0]


def test_chat_warns_too(client):
    """The demo answers chat with a picture: the same warning, on the JSON answer and on the streamed one."""
    ask = {
        "model": "omnistage-demo",
        "messages": [{"role": "user", "content": "a hexagon on the left"}],
        "extra_body": FAST,
    }
    raw = client.chat.completions.with_raw_response.create(**ask)
    header = raw.headers.get("x-omnistage-warning")
    assert header and "'hexagon'" in header and raw.http_response.json()["warnings"] == [header]
    assert raw.parse().choices[0].message.content  # the picture still comes
    with client.chat.completions.with_streaming_response.create(**ask, stream=True) as streamed:
        assert streamed.headers.get("x-omnistage-warning") == header
        assert any(chunk.choices for chunk in streamed.parse())
    known = client.chat.completions.with_raw_response.create(
        **{**ask, "messages": [{"role": "user", "content": "a red circle on the left"}]}
    )
    assert "x-omnistage-warning" not in known.headers
