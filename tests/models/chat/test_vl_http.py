"""``/v1/chat/completions`` with image and video parts, through the official ``openai`` client, against
real servers on the tiny ``qwen2_5_vl`` and ``qwen3_vl`` fixtures: greedy answers and ``usage`` token
counts equal vLLM's own ``LLM.chat`` on the same folder and messages (tests/models/chat/mm_cases.py),
streamed and not, with videos as ``data:``, ``http://`` and ``file://`` URLs (the HTTP API returns
no token ids; tests/models/chat/test_qwen_vl_vllm.py compares ids offline). A bad media part is a
400 naming it, and the server keeps serving.
"""

from __future__ import annotations

import functools
import http.server
import threading

import openai
import pytest

from omnistage.testing.server import serve_engine
from tests.models.chat.mm_cases import (
    CLIP,
    ENGINE,
    GREEDY,
    IMG_A,
    VID_A,
    VL_CASES,
    VL_FAMILIES,
    VL_LIMITS,
    b64,
    image_part,
    text,
    video_part,
    vllm_answers,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    """A folder of media served over HTTP and allowed for file:// URLs."""
    root = tmp_path_factory.mktemp("vl-media")
    (root / "a.mp4").write_bytes(VID_A)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module", params=VL_FAMILIES)
def vl(request, tiny_model, media_dir):
    """(openai client, model name, vLLM's answers); the answers first: one engine at a time."""
    from omnistage import AsyncOmni

    folder = tiny_model(request.param)
    ref = vllm_answers(str(folder), request.param)
    engine = AsyncOmni(folder, limit_mm_per_prompt=VL_LIMITS, **ENGINE)
    with serve_engine(engine, ready_timeout=300, allowed_local_media_path=media_dir[0]) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)
        yield client, client.models.list().data[0].id, ref


def chat(vl, messages, **extra_body):
    client, model, _ = vl
    return client.chat.completions.create(model=model, messages=messages, **GREEDY, extra_body=extra_body or None)


def assert_answer(completion, answer):
    assert completion.choices[0].message.content == answer.text
    assert completion.usage.prompt_tokens == len(answer.prompt_token_ids)  # image/video placeholders counted
    assert completion.usage.completion_tokens == len(answer.token_ids)


@pytest.mark.parametrize("case", list(VL_CASES))
def test_chat_equals_llm_chat(vl, case):
    assert_answer(chat(vl, VL_CASES[case].messages, **VL_CASES[case].chat_kwargs()), vl[2][case])


def test_video_streamed(vl):
    client, model, ref = vl
    stream = client.chat.completions.create(
        model=model,
        messages=VL_CASES["image_and_video"].messages,
        **GREEDY,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, usage = [], None
    for chunk in stream:
        deltas += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(deltas) == ref["image_and_video"].text
    assert usage.prompt_tokens == len(ref["image_and_video"].prompt_token_ids)


def test_video_by_http_and_file_url(vl, media_dir):
    """The same clip fetched by the server (http://, file:// under --allowed-local-media-path)."""
    root, base = media_dir
    question = VL_CASES["one_video"].messages[0]["content"][1]
    for url in (f"{base}/a.mp4", f"file://{root}/a.mp4"):
        content = [{"type": "video_url", "video_url": {"url": url}}, question]
        assert_answer(chat(vl, [{"role": "user", "content": content}]), vl[2]["one_video"])


BAD = [  # (content part, message)
    (
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(b"\x00" * 64)}},
        "not a decodable video",
    ),
    ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(CLIP)}}, "no video stream"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(VID_A)}}, "not a decodable image"),
    ({"type": "video_url", "video_url": {"url": "file:///etc/passwd"}}, "outside the allowed local media path"),
]


@pytest.mark.parametrize("part, message", BAD)
def test_bad_media_part_is_a_400_naming_it(vl, part, message):
    with pytest.raises(openai.BadRequestError) as e:
        chat(vl, [{"role": "user", "content": [text("look"), part]}])
    assert e.value.body["param"] == f"messages[0].content[1].{part['type']}", e.value.body
    assert message in e.value.body["message"], e.value.body


def test_more_videos_than_the_limit(vl):
    with pytest.raises(openai.BadRequestError) as e:
        chat(vl, [{"role": "user", "content": [image_part(IMG_A), video_part(VID_A), video_part(VID_A)]}])
    assert e.value.body["param"] == "messages[0].content[2].video_url", e.value.body
    assert "At most 1 video(s)" in e.value.body["message"], e.value.body


def test_serves_after_bad_requests(vl):
    assert_answer(chat(vl, VL_CASES["one_video"].messages), vl[2]["one_video"])
