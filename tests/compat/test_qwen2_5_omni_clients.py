"""vLLM-Omni's Qwen2.5-Omni example clients (examples/online_serving/qwen2_5_omni: the OpenAI-client script and the
curl script), re-created from their request shapes and run against a tiny Qwen2.5-Omni over HTTP with only the base
URL and the model name changed: the same system turn, content parts (mixed media, two audio clips, a video with
``num_frames`` and ``use_audio_in_video``), full per-stage sampling params lists, modalities. Each answer is held to
what omnistage's own request form gives for the same sampling: the text equal, the WAV decodable and equal
(docs/compatibility.md)."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
import soundfile
from openai import OpenAI

from omnistage.server.media import encode_mp4
from tests.compat.conftest import serve_as_default
from tests.compat.omni_answers import assert_answers_as_ours, counted
from tests.models import omni_media as media
from tests.models.chat.mm_cases import mp4

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CODEC_END = 8294  # the tiny talker's codec end code (the release's)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    yield from serve_as_default(tiny_model, tmp_path_factory, "qwen2_5_omni", "tiny-omni25", CODEC_END)


# The clients' sampling_params_list: thinker, talker, token2wav, every field as they send it
CLIENT_LISTS = [
    {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 2048,
        "seed": 42,
        "detokenize": True,
        "repetition_penalty": 1.1,
    },
    {
        "temperature": 0.9,
        "top_p": 0.8,
        "top_k": 40,
        "max_tokens": 2048,
        "seed": 42,
        "detokenize": True,
        "repetition_penalty": 1.05,
        "stop_token_ids": [8294],
    },
    {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 2048,
        "seed": 42,
        "detokenize": True,
        "repetition_penalty": 1.1,
    },
]


def native(messages: list[dict], modalities: list[str], **extra) -> dict:
    """omnistage's own form of the same sampling: greedy with the repetition penalty and no max_tokens (to the end
    of the context, as vllm serve runs), the talker's own fields only."""
    return {
        "model": "tiny-omni25",
        "messages": messages,
        "modalities": modalities,
        "temperature": 0,
        "repetition_penalty": 1.1,
        "sampling_params_list": [
            None,
            {
                "temperature": 0.9,
                "top_p": 0.8,
                "top_k": 40,
                "max_tokens": 2048,
                "seed": 42,
                "repetition_penalty": 1.05,
            },
            {"seed": 42},
        ],
        **extra,
    }


SYSTEM = {
    "role": "system",
    "content": [{"type": "text", "text": "You are an assistant who hears, sees and answers in text and speech."}],
}
CLIPS = [media.clip(1.0, 0), media.clip(1.0, 1)]
WAV_URLS = ["data:audio/wav;base64," + media.wav_base64(c) for c in CLIPS]
IMAGE_URL = media.png_url(media.image(0))
VIDEO_URL = "data:video/mp4;base64," + base64.b64encode(mp4(media.frames(4, 0), fps=2)).decode()
QUERIES = {  # the scripts' query types (their remote media as data: URLs of local files)
    "text": ([{"type": "text", "text": "Explain an audio generation pipeline in a few words."}], {}),
    "mixed_modalities": (
        [
            {"type": "audio_url", "audio_url": {"url": WAV_URLS[0]}},
            {"type": "image_url", "image_url": {"url": IMAGE_URL}},
            {"type": "video_url", "video_url": {"url": VIDEO_URL}},
            {"type": "text", "text": "What is said? What is in the image? Why is the video funny?"},
        ],
        {},
    ),
    "multi_audios": (
        [
            {"type": "audio_url", "audio_url": {"url": WAV_URLS[0]}},
            {"type": "audio_url", "audio_url": {"url": WAV_URLS[1]}},
            {"type": "text", "text": "Are these two clips the same?"},
        ],
        {},
    ),
}


def chat(server: str, body: dict) -> dict:
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def wav(data_b64: str) -> np.ndarray:
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(data_b64)), dtype="float32")
    assert rate == 24000
    return samples


def test_the_openai_client_speaks_as_omnistages_own_request(server):
    """The Python client's run of query ``text`` with no modalities (text and speech), read as it reads it."""
    client = OpenAI(base_url=f"{server}/v1", api_key="EMPTY")
    parts, _ = QUERIES["text"]
    messages = [SYSTEM, {"role": "user", "content": parts}]
    raw = client.chat.completions.with_raw_response.create(
        messages=messages, model="default", modalities=None, extra_body={"sampling_params_list": CLIENT_LISTS}
    )
    ours = chat(server, native(messages, ["text", "audio"]))
    assert_answers_as_ours(raw, ours, wav)


@pytest.mark.parametrize("query", ["mixed_modalities", "multi_audios"])
def test_the_openai_client_with_modalities_text(server, query):
    client = OpenAI(base_url=f"{server}/v1", api_key="EMPTY")
    parts, _ = QUERIES[query]
    messages = [SYSTEM, {"role": "user", "content": parts}]
    completion = client.chat.completions.create(
        messages=messages, model="default", modalities=["text"], extra_body={"sampling_params_list": CLIENT_LISTS}
    )
    ours = chat(server, native(messages, ["text"]))
    assert completion.choices[0].message.content == ours["choices"][0]["message"]["content"]
    assert completion.choices[0].message.audio is None
    assert counted(completion.usage.model_dump(exclude_none=True)) == counted(ours["usage"])


def test_the_curl_script_use_audio_in_video(server):
    """The curl script's ``use_audio_in_video`` body: top-level sampling_params_list, ``mm_processor_kwargs``
    asking for the video's soundtrack, a ``video_url`` with ``num_frames``, modalities null (speech too)."""
    soundtrack = np.tile(CLIPS[0], 2)  # 2 s under the 2 s of frames
    video = encode_mp4(media.frames(4, 0), 2, soundtrack, media.RATE)  # H.264 + AAC, as a phone records
    url = "data:video/mp4;base64," + base64.b64encode(video).decode()
    parts = [
        {"type": "video_url", "video_url": {"url": url, "num_frames": 16}},
        {"type": "text", "text": "Describe the video, then write down what is said."},
    ]
    messages = [SYSTEM, {"role": "user", "content": parts}]
    kwargs = {"use_audio_in_video": True}
    body = chat(
        server,
        {
            "model": "default",
            "sampling_params_list": CLIENT_LISTS,
            "mm_processor_kwargs": kwargs,
            "modalities": None,
            "messages": messages,
        },
    )
    ours = chat(server, native(messages, ["text", "audio"], mm_processor_kwargs=kwargs))
    assert body["choices"][0]["message"]["content"] == ours["choices"][0]["message"]["content"]
    assert np.array_equal(
        wav(body["choices"][0]["message"]["audio"]["data"]), wav(ours["choices"][0]["message"]["audio"]["data"])
    )
