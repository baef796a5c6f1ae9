"""``/v1/chat/completions`` with image and audio parts against real servers on the tiny ``vlm``
(Idefics3) and ``audio_lm`` (Qwen2-Audio) fixtures: greedy answers and ``usage.prompt_tokens``
equal vLLM's own ``LLM.chat`` on the same folder and messages (tests/models/chat/mm_cases.py),
streamed and not, with media as ``data:``, ``http://`` and ``file://`` URLs; bad media and
media a model cannot take are 400s naming the part, and the servers keep serving. Qwen2-Audio also transcribes
(``/v1/audio/transcriptions``), equal to transformers' ``generate`` on the same chat turn.
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import threading

import httpx
import numpy as np
import pytest

from omnistage.server.media import encode_mp4
from omnistage.testing.server import serve_engine
from tests.models.chat.mm_cases import (
    AUDIO_CASES,
    CLIP,
    ENGINE,
    GREEDY,
    IMG_A,
    IMG_C,
    LIMITS,
    VLM_CASES,
    b64,
    image_part,
    text,
    vllm_answers,
)

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    """A folder of media served over HTTP and allowed for file:// URLs."""
    root = tmp_path_factory.mktemp("media")
    (root / "c.png").write_bytes(IMG_C)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _server(folder, media_root=None, **kw):
    from omnistage import AsyncOmni

    return serve_engine(AsyncOmni(folder, **ENGINE, **kw), ready_timeout=300, allowed_local_media_path=media_root)


@pytest.fixture(scope="module")
def vlm(tiny_model, media_dir):
    ref = vllm_answers(str(tiny_model("vlm")), "vlm")  # before the server: one engine at a time
    with _server(tiny_model("vlm"), media_dir[0], limit_mm_per_prompt=LIMITS) as srv:
        yield srv, ref


@pytest.fixture(scope="module")
def audio_lm(tiny_model):
    ref = vllm_answers(str(tiny_model("audio_lm")), "audio_lm")
    with _server(tiny_model("audio_lm")) as srv:
        yield srv, ref


def chat(srv, messages, **fields):
    with httpx.Client(base_url=srv.url, timeout=300) as c:
        return c.post("/v1/chat/completions", json={"messages": messages, **GREEDY, **fields})


def assert_answer(resp, answer):
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["message"]["content"] == answer.text
    assert body["usage"]["prompt_tokens"] == len(answer.prompt_token_ids)  # image/audio placeholders counted
    assert body["usage"]["completion_tokens"] == len(answer.token_ids)


@pytest.mark.parametrize("case", list(VLM_CASES))
def test_vlm_chat_equals_llm_chat(vlm, case):
    srv, ref = vlm
    assert_answer(chat(srv, VLM_CASES[case].messages, **VLM_CASES[case].chat_kwargs()), ref[case])


def test_vlm_streamed(vlm):
    srv, ref = vlm
    body = {
        "messages": VLM_CASES["two_images"].messages,
        **GREEDY,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    deltas, usage = [], None
    with httpx.Client(base_url=srv.url, timeout=300) as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            deltas += [ch["delta"].get("content") or "" for ch in chunk["choices"]]
            usage = chunk.get("usage") or usage
    assert "".join(deltas) == ref["two_images"].text
    assert usage["prompt_tokens"] == len(ref["two_images"].prompt_token_ids)


def test_vlm_media_by_http_and_file_url(vlm, media_dir):
    """The same picture fetched by the server (http://, file:// under --allowed-local-media-path)."""
    srv, ref = vlm
    root, base = media_dir
    case = VLM_CASES["earlier_turn"]
    for url in (f"{base}/c.png", f"file://{root}/c.png"):
        messages = [
            dict(
                case.messages[0],
                content=[{"type": "image_url", "image_url": {"url": url}}, case.messages[0]["content"][1]],
            ),
            *case.messages[1:],
        ]
        assert_answer(chat(srv, messages), ref["earlier_turn"])


@pytest.mark.parametrize("case", list(AUDIO_CASES))
def test_audio_chat_equals_llm_chat(audio_lm, case):
    srv, ref = audio_lm
    assert_answer(chat(srv, AUDIO_CASES[case].messages), ref[case])


def test_audio_by_url(audio_lm):
    srv, ref = audio_lm
    url = {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + b64(CLIP)}}
    messages = [{"role": "user", "content": [url, text("what is this sound")]}]
    assert_answer(chat(srv, messages), ref["one_clip"])


def _mp4() -> bytes:
    return encode_mp4(np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8), 2)


def _bad(part):
    return [{"role": "user", "content": [text("look"), part]}]


BAD = [  # (content part, param, status, message)
    (
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        "messages[0].content[1].image_url",
        400,
        "not a decodable image",
    ),
    (
        {"type": "input_audio", "input_audio": {"data": b64(b"not audio at all"), "format": "wav"}},
        "messages[0].content[1].input_audio",
        400,
        "not decodable audio",
    ),
    (
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(b"\x00" * 64)}},
        "messages[0].content[1].video_url",
        400,
        "not a decodable video",
    ),
    (
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
        "messages[0].content[1].image_url",
        400,
        "outside the allowed local media path",
    ),
    # decodable, but not something this model takes
    (
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(_mp4())}},
        "messages[0].content[1].video_url",
        400,
        "takes no video input",
    ),
    (
        {"type": "input_audio", "input_audio": {"data": b64(CLIP), "format": "wav"}},
        "messages[0].content[1].input_audio",
        400,
        "takes no audio input",
    ),
]


@pytest.mark.parametrize("part, param, status, message", BAD)
def test_vlm_bad_media_name_the_part(vlm, part, param, status, message):
    srv, _ = vlm
    r = chat(srv, _bad(part))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err


def test_vlm_more_images_than_the_limit(vlm):
    srv, _ = vlm
    r = chat(srv, [{"role": "user", "content": [image_part(IMG_A)] * 3}])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[0].content[2].image_url" and "At most 2 image(s)" in err["message"], err


def test_text_only_model_refuses_an_image(tiny_model):
    with _server(tiny_model("chat")) as srv:
        r = chat(srv, [{"role": "user", "content": [text("hi"), image_part(IMG_A)]}])
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1].image_url" and "takes text only" in err["message"], err
        ok = chat(srv, [{"role": "user", "content": "hi"}])  # and still serves
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]


def test_servers_keep_serving_after_bad_requests(vlm, audio_lm):
    for (srv, ref), case, cases in ((vlm, "one_image", VLM_CASES), (audio_lm, "one_clip", AUDIO_CASES)):
        assert_answer(chat(srv, cases[case].messages), ref[case])


def test_qwen2_audio_transcribes_as_transformers_hears_the_same_turn(audio_lm, tiny_model):
    """``/v1/audio/transcriptions`` and ``/translations`` on the Qwen2-Audio chat model through the official client:
    the text equals transformers' greedy ``generate`` on the chat turn the hook builds (the audio, then the
    instruction; omnistage/models/shared/transcription_chat.py); a language the model card does not list is a 400."""
    import openai
    import soundfile as sf

    from omnistage.models.shared.transcription_chat import instruction
    from tests.models import omni_media as media
    from tests.models.chat.test_tiny_multimodal import _transformers_generate

    srv, _ = audio_lm
    samples = media.clip(1.5, 3)
    buf = io.BytesIO()
    sf.write(buf, samples, media.RATE, format="WAV", subtype="FLOAT")  # lossless: both sides hear these samples
    file = ("clip.wav", buf.getvalue(), "audio/wav")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    extra = {"max_tokens": GREEDY["max_tokens"]}

    folder = str(tiny_model("audio_lm"))

    def want(language: str, task: str) -> str:
        from transformers import AutoTokenizer

        parts = [{"type": "input_audio"}, {"type": "text", "text": instruction(language, task)}]
        _, ids = _transformers_generate(
            folder, [{"role": "user", "content": parts}], audio=[samples], sampling_rate=media.RATE
        )
        # (a character cut by max_tokens is held back by vLLM's detokenizer, written U+FFFD by decode)
        return AutoTokenizer.from_pretrained(folder).decode(ids, skip_special_tokens=True).rstrip("\ufffd")

    english = client.audio.transcriptions.create(model=model, file=file, language="en", extra_body=extra).text
    german = client.audio.transcriptions.create(model=model, file=file, language="de", extra_body=extra).text
    french = client.audio.translations.create(model=model, file=file, extra_body={**extra, "language": "fr"}).text
    assert (english, german, french) == (want("en", "transcribe"), want("de", "transcribe"), want("fr", "translate"))
    assert len({english, german, french}) > 1  # the instruction reaches the model
    r = httpx.post(
        srv.url + "/v1/audio/transcriptions", data={"model": model, "language": "ko"}, files={"file": file}, timeout=60
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "language"
    assert chat(srv, AUDIO_CASES["one_clip"].messages).status_code == 200  # chat still served
