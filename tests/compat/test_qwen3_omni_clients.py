"""vLLM-Omni's Qwen3-Omni example clients (examples/online_serving/qwen3_omni: the OpenAI-client script and the curl
script), re-created from their request shapes and run against a tiny Qwen3-Omni over HTTP with only the base URL and
the model name changed: the same system turn, content parts, full per-stage sampling params lists (``extra_body``
for the OpenAI client, top-level for curl), modalities. Each answer is held to what omnistage's own request form
gives for the same sampling: the text equal, the WAV decodable and equal (docs/compatibility.md)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile
from openai import OpenAI
from transformers import AutoTokenizer

from tests.compat.conftest import serve_as_default
from tests.compat.omni_answers import assert_answers_as_ours, counted
from tests.models import omni_media as media
from tests.models.chat.mm_cases import mp4

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CODEC_EOS = 2150  # the tiny talker's codec end code (the release's)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    yield from serve_as_default(tiny_model, tmp_path_factory, "qwen3_omni", "tiny-omni", CODEC_EOS)


@pytest.fixture(scope="module")
def im_end(tiny_model) -> int:
    """The clients stop the thinker at ``<|im_end|>`` by the release's id (151645); the tiny tokenizer numbers it
    differently (its vocabulary has 400 tokens), so the tests send the tiny's id for the same token."""
    return AutoTokenizer.from_pretrained(tiny_model("qwen3_omni")).convert_tokens_to_ids("<|im_end|>")


def client_lists(im_end: int) -> list[dict]:
    """The clients' sampling_params_list: thinker, talker, code2wav, every field as they send it."""
    thinker = {
        "temperature": 0.4,
        "top_p": 0.9,
        "top_k": 1,
        "max_tokens": 16384,
        "repetition_penalty": 1.05,
        "stop_token_ids": [im_end],
        "seed": 42,
    }
    talker = {
        "temperature": 0.9,
        "top_k": 50,
        "max_tokens": 4096,
        "seed": 42,
        "detokenize": False,
        "repetition_penalty": 1.05,
        "stop_token_ids": [2150],
    }
    code2wav = {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 65536,
        "seed": 42,
        "detokenize": True,
        "repetition_penalty": 1.1,
    }
    return [thinker, talker, code2wav]


def native(im_end: int, messages: list[dict], modalities: list[str]) -> dict:
    """omnistage's own form of the same sampling: greedy (top_k 1 is greedy) with the repetition penalty, no
    max_tokens (to the end of the context, as vllm serve runs), the talker's own fields only."""
    return {
        "model": "tiny-omni",
        "messages": messages,
        "modalities": modalities,
        "temperature": 0,
        "repetition_penalty": 1.05,
        "stop_token_ids": [im_end],
        "sampling_params_list": [
            None,
            {"temperature": 0.9, "top_k": 50, "max_tokens": 4096, "seed": 42, "repetition_penalty": 1.05},
            {"seed": 42},
        ],
    }


SYSTEM = {
    "role": "system",
    "content": [{"type": "text", "text": "You are an assistant who hears, sees and answers in text and speech."}],
}
CLIP, IMAGE = media.clip(1.0, 0), media.image(0)
WAV_URL = "data:audio/wav;base64," + media.wav_base64(CLIP)
VIDEO_URL = "data:video/mp4;base64," + base64.b64encode(mp4(media.frames(4, 0), fps=2)).decode()
QUERIES = {  # the scripts' query types: a media part (as a data: URL of a local file), then the question
    "text": [{"type": "text", "text": "Explain an audio generation pipeline in a few words."}],
    "use_audio": [{"type": "audio_url", "audio_url": {"url": WAV_URL}}, {"type": "text", "text": "What is this?"}],
    "use_image": [
        {"type": "image_url", "image_url": {"url": media.png_url(IMAGE)}},
        {"type": "text", "text": "What is in this image?"},
    ],
    "use_video": [{"type": "video_url", "video_url": {"url": VIDEO_URL}}, {"type": "text", "text": "Why funny?"}],
}


def chat(server: str, body: dict) -> dict:
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def wav(data_b64: str) -> np.ndarray:
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(data_b64)), dtype="float32")
    assert rate == 24000
    return samples


def test_the_openai_client_speaks_as_omnistages_own_request(server, im_end):
    """The Python client's default run (query ``text``, no modalities: text and speech), read as it reads it."""
    client = OpenAI(base_url=f"{server}/v1", api_key="EMPTY")
    messages = [SYSTEM, {"role": "user", "content": QUERIES["text"]}]
    raw = client.chat.completions.with_raw_response.create(
        messages=messages, model="default", modalities=None, extra_body={"sampling_params_list": client_lists(im_end)}
    )
    ours = chat(server, native(im_end, messages, ["text", "audio"]))
    assert_answers_as_ours(raw, ours, wav)


def test_the_openai_client_with_modalities_text(server, im_end):
    client = OpenAI(base_url=f"{server}/v1", api_key="EMPTY")
    messages = [SYSTEM, {"role": "user", "content": QUERIES["use_image"]}]
    completion = client.chat.completions.create(
        messages=messages,
        model="default",
        modalities=["text"],
        extra_body={"sampling_params_list": client_lists(im_end)},
    )
    ours = chat(server, native(im_end, messages, ["text"]))
    assert completion.choices[0].message.content == ours["choices"][0]["message"]["content"]
    assert completion.choices[0].message.audio is None
    assert counted(completion.usage.model_dump(exclude_none=True)) == counted(ours["usage"])


@pytest.mark.parametrize("query, modalities", [("use_audio", None), ("use_video", ["text"])])
def test_the_curl_script(server, im_end, query, modalities):
    """The curl script's body: sampling_params_list and mm_processor_kwargs at the top level, modalities null (its
    default) or a list; it prints ``.choices[0].message.content``."""
    messages = [SYSTEM, {"role": "user", "content": QUERIES[query]}]
    body = chat(
        server,
        {
            "model": "default",
            "sampling_params_list": client_lists(im_end),
            "mm_processor_kwargs": {},
            "modalities": modalities,
            "messages": messages,
        },
    )
    ours = chat(server, native(im_end, messages, ["text"]))
    assert body["choices"][0]["message"]["content"] == ours["choices"][0]["message"]["content"]
    if modalities is None:  # speech too
        assert wav(body["choices"][0]["message"]["audio"]["data"]).size > 0


def test_content_parts_without_type(server, im_end):
    """vLLM-Omni's documented short form: ``{"text": ...}``, ``{"image": "<base64>"}``, ``{"audio": ...}``."""
    png = media.png_url(IMAGE).split(",", 1)[1]
    short = [{"image": png}, {"audio": media.wav_base64(CLIP)}, {"text": "What do you see and hear?"}]
    typed = [
        {"type": "image_url", "image_url": {"url": media.png_url(IMAGE)}},
        {"type": "audio_url", "audio_url": {"url": WAV_URL}},
        {"type": "text", "text": "What do you see and hear?"},
    ]
    got = chat(server, native(im_end, [{"role": "user", "content": short}], ["text"]))
    expected = chat(server, native(im_end, [{"role": "user", "content": typed}], ["text"]))
    assert got["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]
    assert counted(got["usage"]) == counted(expected["usage"])  # the same media placeholders


@pytest.mark.parametrize(
    "entry, param",
    [
        ({"temprature": 0.5}, "temprature"),  # no SamplingParams field: still refused, named
        ({"max_tokens": "many"}, "max_tokens"),  # a field the talker reads, of the wrong type
    ],
)
def test_a_name_that_is_no_field_is_still_a_400(server, entry, param):
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
            "sampling_params_list": [None, entry],
        },
        timeout=600,
    )
    assert r.status_code == 400 and param in r.json()["error"]["message"]


def test_default_is_answered_as_the_one_model_served(server):
    """The clients send ``model: "default"`` to a server started without that name (as vLLM-Omni's answers)."""
    models = httpx.get(f"{server}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny-omni"]
    assert httpx.get(f"{server}/v1/models/default").json()["id"] == "tiny-omni"
    r = httpx.post(
        f"{server}/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 404 and "'tiny-omni'" in r.json()["error"]["message"]


def test_finish_reason_and_usage_do_not_depend_on_the_modalities(server):
    """A reply cut at max_tokens is ``length`` with or without speech; usage counts the thinker's tokens either way;
    speech alone carries the reply as ``audio.transcript`` (OpenAI's form) with no content."""
    base = {
        "model": "default",
        "messages": [{"role": "user", "content": "hello, who are you?"}],
        "temperature": 0,
        "max_tokens": 5,
        "sampling_params_list": [None, {"temperature": 0.9, "top_k": 50, "seed": 42, "max_tokens": 8}],
    }
    text = chat(server, {**base, "modalities": ["text"]})
    both = chat(server, {**base, "modalities": ["text", "audio"]})
    audio = chat(server, {**base, "modalities": ["audio"]})
    assert text["usage"]["completion_tokens"] == 5 and text["usage"]["prompt_tokens"] > 0
    for body in (both, audio):
        assert body["choices"][0]["finish_reason"] == text["choices"][0]["finish_reason"] == "length"
        assert counted(body["usage"], speech=False) == counted(text["usage"], speech=False)
    speech = [b["usage"]["completion_tokens_details"]["audio_tokens"] for b in (text, both, audio)]
    assert speech[0] == 0 and speech[1] == speech[2] > 0  # the talker's codec tokens, only when it speaks
    reply = text["choices"][0]["message"]["content"]
    assert both["choices"][0]["message"]["audio"]["transcript"] == reply
    assert audio["choices"][0]["message"]["content"] is None
    assert audio["choices"][0]["message"]["audio"]["transcript"] == reply
    assert np.array_equal(
        wav(audio["choices"][0]["message"]["audio"]["data"]), wav(both["choices"][0]["message"]["audio"]["data"])
    )
    # streamed, speech alone: the transcript as delta.audio.transcript chunks, the same finish reason and usage
    chunks = []
    with httpx.stream(
        "POST",
        f"{server}/v1/chat/completions",
        json={**base, "modalities": ["audio"], "stream": True, "stream_options": {"include_usage": True}},
        timeout=600,
    ) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("audio", {}).get("transcript", "") for d in deltas) == reply
    assert not "".join(d.get("content") or "" for d in deltas)
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert counted(chunks[-1]["usage"]) == counted(audio["usage"])


def test_the_openai_client_reads_the_usage_details(server):
    """``usage.prompt_tokens_details`` / ``completion_tokens_details`` as the official client parses them: the
    prompt split into its audio placeholders and its text, the reply's text tokens, the same whatever the
    modalities; the speech's codec tokens in ``completion_tokens_details.audio_tokens``; a prompt sent again is
    partly read from vLLM's prefix cache (``cached_tokens``)."""
    client = OpenAI(base_url=f"{server}/v1", api_key="EMPTY", max_retries=0)
    # a long question: vLLM caches whole blocks of the prompt (128 tokens on the CPU)
    question = {"type": "text", "text": "Say what you hear, slowly and in detail. " * 10}
    messages = [{"role": "user", "content": [QUERIES["use_audio"][0], question]}]
    talker = {"temperature": 0.9, "top_k": 50, "seed": 42, "max_tokens": 8}
    usages = {}
    for modalities in (["text"], ["text", "audio"], ["audio"]):
        completion = client.chat.completions.create(
            messages=messages,
            model="default",
            modalities=modalities,
            temperature=0,
            max_tokens=5,
            extra_body={"sampling_params_list": [None, talker]},
        )
        usages[tuple(modalities)] = completion.usage
    text_only = usages[("text",)]
    prompt, reply = text_only.prompt_tokens_details, text_only.completion_tokens_details
    assert prompt.audio_tokens > 0 and prompt.image_tokens == 0
    assert prompt.text_tokens + prompt.audio_tokens == text_only.prompt_tokens
    assert reply.text_tokens == text_only.completion_tokens == 5 and reply.audio_tokens == 0
    for usage in usages.values():
        assert counted(usage.model_dump(), speech=False) == counted(text_only.model_dump(), speech=False)
    spoken = [usages[m].completion_tokens_details.audio_tokens for m in (("text", "audio"), ("audio",))]
    assert spoken[0] == spoken[1] > 0
    assert usages[("audio",)].prompt_tokens_details.cached_tokens > 0  # the third time, the prompt is cached


def test_a_bad_short_form_part_names_the_key_sent(server):
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": [{"image": "bm90IGFuIGltYWdl"}, {"text": "what?"}]}]},
        timeout=600,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].image"
