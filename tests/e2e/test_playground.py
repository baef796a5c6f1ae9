"""The playground page (GET /) in headless Chromium against real servers, one per kind of model: chat
(tiny vLLM chat model), images (the built-in demo: the session's ``demo_server``), speech (tiny codec_tts
on vLLM) and video (tiny Wan).

Each test drives the page as a user would and checks what it shows against what the server answers the same
request with over plain HTTP (so the page neither loses nor changes anything), plus the stage metrics table.
Screenshots go to test-artifacts/. Install the browser with scripts/install-browser.sh.
"""

from __future__ import annotations

import base64
import io
import os
import time

import httpx
import numpy as np
import pytest
import soundfile
from selenium.webdriver.support.ui import Select

from omnistage import AsyncOmni
from tests.e2e.browser import requires_browser, screenshot, wait_for
from tests.e2e.playground_page import (
    data_url_bytes,
    element_bytes,
    fill,
    metrics_rows,
    no_error,
    open_page,
    pixels,
    png,
    visible_tabs,
)

# One engine-core process per vLLM engine, no extra worker process: starts in half the time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

pytestmark = [pytest.mark.slow, requires_browser]

VLLM = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}


def serve(engine: AsyncOmni, tmp_path_factory, **options):
    from omnistage.config.settings import ServerSettings
    from omnistage.testing.server import serve_engine

    settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("storage"))})
    return serve_engine(engine, settings, ready_timeout=300, **options)  # vLLM starts slowly on 2 busy cores


@pytest.fixture(scope="module")
def chat_srv(tiny_model, tmp_path_factory):
    with serve(AsyncOmni(tiny_model("chat"), **VLLM), tmp_path_factory, served_model_name="tiny-chat") as srv:
        yield srv


@pytest.fixture(scope="module")
def tts_srv(tiny_model, tmp_path_factory):
    engine = AsyncOmni(tiny_model("codec_tts"), max_model_len=512, dtype="float32")
    with serve(engine, tmp_path_factory, served_model_name="tiny-tts") as srv:
        yield srv


@pytest.fixture(scope="module")
def wan_srv(tiny_model, tmp_path_factory):
    with serve(AsyncOmni(tiny_model("wan")), tmp_path_factory, served_model_name="tiny-wan") as srv:
        yield srv


# --------------------------------------------------------------------------- chat


@pytest.mark.vllm
def test_chat_streams_the_answer(chat_srv, browser):
    # 128 tokens: vLLM merges the deltas a busy reader has not taken yet, so a short answer on a loaded machine
    # can come as one piece; over a longer one the reader keeps up at least now and then
    ask = {"messages": [{"role": "user", "content": "hello world"}], "max_tokens": 128, "temperature": 0}
    with chat_srv.client(timeout=120) as c:
        card = c.get("/v1/models").json()["data"][0]
        want = c.post("/v1/chat/completions", json=ask).json()
    assert card["routes"] == ["chat"] and card["output_modalities"] == ["text"]
    text, tokens = want["choices"][0]["message"]["content"], want["usage"]["completion_tokens"]
    assert text and tokens > 1

    open_page(browser, chat_srv.url, "tiny-chat", "tab-chat")
    assert visible_tabs(browser) == ["tab-chat"]
    fill(browser, "chat-input", "hello world")
    fill(browser, "chat-max-tokens", "128")
    fill(browser, "chat-temperature", "0")
    browser.find_element("id", "chat-send").click()
    answer = wait_for(
        browser, 120, lambda d: d.find_elements("css selector", ".msg.assistant[data-done=true]"), "the streamed answer"
    )[0]
    no_error(browser)
    assert answer.find_element("class name", "text").get_attribute("textContent") == text
    assert int(answer.get_attribute("data-deltas")) > 1  # it arrived in pieces, not as one body
    rows = metrics_rows(browser)
    assert list(rows) == ["0"] and rows["0"]["Tokens"] == str(tokens) and rows["0"]["Kind"] == "llm"
    assert f"{tokens} completion" in browser.find_element("id", "metrics-summary").text
    screenshot(browser, "playground-chat.png")

    # the next turn carries the conversation: the server sees both user messages and the first answer
    fill(browser, "chat-input", "and again")
    browser.find_element("id", "chat-send").click()
    wait_for(
        browser,
        120,
        lambda d: len(d.find_elements("css selector", ".msg.assistant[data-done=true]")) == 2,
        "the second answer",
    )
    turn2 = {
        **ask,
        "messages": ask["messages"]
        + [{"role": "assistant", "content": text}, {"role": "user", "content": "and again"}],
    }
    with chat_srv.client(timeout=120) as c:
        want2 = c.post("/v1/chat/completions", json=turn2).json()["choices"][0]["message"]["content"]
    got2 = browser.find_elements("css selector", ".msg.assistant .text")[1].get_attribute("textContent")
    assert got2 == want2


def test_chat_answers_in_every_modality_the_model_has(server_factory, browser):
    """A pipeline with text, audio, image and video outputs (small real-torch stages, tests/server/pipelines.py):
    the streamed answer holds the text, a playable clip of the streamed audio, the image and the video."""
    from tests.server.pipelines import SAMPLE_RATE, omni_pipeline

    srv = server_factory(AsyncOmni(pipeline=omni_pipeline()))
    open_page(browser, srv.url, "test_omni", "tab-video")
    assert visible_tabs(browser) == ["tab-chat", "tab-image", "tab-speech", "tab-video", "tab-talk"]  # it speaks: talk
    browser.find_element("id", "tab-chat").click()
    boxes = browser.find_elements("css selector", "#chat-modalities input")
    assert [b.get_attribute("value") for b in boxes] == ["text", "image", "audio", "video"]
    fill(browser, "chat-input", "sing a song")
    browser.find_element("id", "chat-send").click()
    answer = wait_for(
        browser, 60, lambda d: d.find_elements("css selector", ".msg.assistant[data-done=true]"), "the answer"
    )[0]
    no_error(browser)
    assert answer.find_element("class name", "text").get_attribute("textContent") == "echo sing a song"
    assert int(answer.get_attribute("data-deltas")) == 4  # one per word: streamed
    audio = answer.find_element("tag name", "audio")
    wait_for(browser, 10, lambda d: d.execute_script("return arguments[0].readyState >= 1", audio), "the audio")
    clip, rate = soundfile.read(io.BytesIO(element_bytes(browser, audio)), dtype="int16")
    assert rate == SAMPLE_RATE and clip.shape == (4 * int(0.05 * SAMPLE_RATE),)  # 0.05 s a word
    img = answer.find_element("tag name", "img")
    assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) == 32
    video = answer.find_element("tag name", "video")
    wait_for(browser, 10, lambda d: d.execute_script("return arguments[0].readyState >= 1", video), "the video")
    assert list(metrics_rows(browser)) == ["0", "1", "2", "3"]
    screenshot(browser, "playground-chat-omni.png")

    # only text: unticking the others sends `modalities`, and only the text stage answers
    for box in boxes[1:]:
        box.click()
    fill(browser, "chat-input", "once more")
    browser.find_element("id", "chat-send").click()
    wait_for(
        browser,
        60,
        lambda d: len(d.find_elements("css selector", ".msg.assistant[data-done=true]")) == 2,
        "the text-only answer",
    )
    second = browser.find_elements("css selector", ".msg.assistant")[1]
    assert second.find_element("class name", "text").get_attribute("textContent") == "echo once more"
    assert second.find_elements("tag name", "img") == second.find_elements("tag name", "audio") == []
    assert list(metrics_rows(browser)) == ["0"]


def test_a_server_with_an_api_key(server_factory, browser):
    """Without the key the page says how to give it; with /?api_key=... every request carries it."""
    from tests.server.pipelines import image_pipeline

    srv = server_factory(AsyncOmni(pipeline=image_pipeline()), api_key="sesame")
    browser.get(srv.url + "/")
    box = wait_for(
        browser,
        30,
        lambda d: d.find_element("id", "error").is_displayed() and d.find_element("id", "error"),
        "the error box",
    )
    assert "Error 401" in box.text and "/?api_key=" in box.text, box.text
    open_page(browser, srv.url + "/?api_key=sesame", "test_image", "tab-image")
    browser.find_element("id", "generate").click()
    img = wait_for(browser, 30, lambda d: d.find_elements("id", "result-image"), "the image")[0]
    no_error(browser)
    assert img.get_attribute("src").startswith("data:image/png;base64,")


# --------------------------------------------------------------------------- images (the demo)


def test_image_generation_shows_the_servers_image(demo_server, browser):
    open_page(browser, demo_server, "omnistage-demo", "tab-image")
    assert visible_tabs(browser) == ["tab-chat", "tab-image"]
    # the card's defaults fill the form: the demo draws 64x64 in 20 steps
    assert browser.find_element("id", "size").get_attribute("value") == "64x64"
    assert browser.find_element("id", "steps").get_attribute("value") == "20"
    fill(browser, "prompt", "a large yellow square on the right")
    fill(browser, "seed", "3")
    browser.find_element("id", "generate").click()
    img = wait_for(browser, 120, lambda d: d.find_elements("id", "result-image"), "the generated image")[0]
    wait_for(
        browser,
        30,
        lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img),
        "the image to decode",
    )
    no_error(browser)
    with httpx.Client(base_url=demo_server, timeout=120) as c:
        want = c.post(
            "/v1/images/generations",
            json={
                "prompt": "a large yellow square on the right",
                "seed": 3,
                "size": "64x64",
                "num_inference_steps": 20,
            },
        ).json()
    got = pixels(data_url_bytes(img.get_attribute("src")))
    assert got.shape == (64, 64, 3)
    assert np.array_equal(got, pixels(base64.b64decode(want["data"][0]["b64_json"])))
    rows = metrics_rows(browser)
    assert list(rows) == ["0"] and rows["0"]["Steps"] == "20" and rows["0"]["Kind"] == "diffusion"
    screenshot(browser, "playground-image.png")


def test_image_edit_from_an_upload_and_from_a_paste(demo_server, browser, tmp_path):
    red, blue = png((220, 30, 30)), png((30, 60, 220))
    upload = tmp_path / "red.png"
    upload.write_bytes(red)
    open_page(browser, demo_server, "omnistage-demo", "tab-image")
    fill(browser, "prompt", "a small green circle")
    browser.find_element("id", "mode-edit").click()
    browser.find_element("id", "edit-file").send_keys(str(upload))
    wait_for(browser, 10, lambda d: d.find_element("id", "edit-preview").is_displayed(), "the upload's preview")
    fill(browser, "strength", "0.7")

    def edit_and_compare(source: bytes, shot: str) -> np.ndarray:
        before = browser.find_elements("id", "result-image")
        browser.find_element("id", "generate").click()
        img = wait_for(
            browser,
            120,
            lambda d: [i for i in d.find_elements("id", "result-image") if i not in before],
            "the edited image",
        )[0]
        no_error(browser)
        form = {
            "prompt": "a small green circle",
            "size": "64x64",
            "num_inference_steps": "20",
            "seed": "0",
            "strength": "0.7",
        }
        with httpx.Client(base_url=demo_server, timeout=120) as c:
            r = c.post("/v1/images/edits", files={"image": ("in.png", source, "image/png")}, data=form)
        assert r.status_code == 200, r.text
        got = pixels(data_url_bytes(img.get_attribute("src")))
        assert np.array_equal(got, pixels(base64.b64decode(r.json()["data"][0]["b64_json"])))
        screenshot(browser, shot)
        return got

    from_red = edit_and_compare(red, "playground-edit-upload.png")
    # a pasted image (Ctrl+V anywhere on the page) replaces the one to edit
    browser.execute_script(
        """
        const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], "pasted.png", {type: "image/png"}));
        document.dispatchEvent(new ClipboardEvent("paste", {clipboardData: dt, bubbles: true}));""",
        base64.b64encode(blue).decode(),
    )
    wait_for(
        browser,
        10,
        lambda d: (
            d.find_element("id", "edit-preview").get_attribute("src")
            == "data:image/png;base64," + base64.b64encode(blue).decode()
        ),
        "the pasted image's preview",
    )
    from_blue = edit_and_compare(blue, "playground-edit-paste.png")
    assert not np.array_equal(from_red, from_blue)  # the input image matters: each edit used its own


def test_chat_with_an_image_attachment(demo_server, browser, tmp_path):
    """Image in through chat (an image_url content part with a data: URL), image out in the streamed answer."""
    source = png((30, 160, 60))
    upload = tmp_path / "green.png"
    upload.write_bytes(source)
    open_page(browser, demo_server, "omnistage-demo", "tab-image")
    browser.find_element("id", "tab-chat").click()
    fill(browser, "chat-input", "a red circle")
    fill(browser, "chat-extra", '{"seed": 5, "num_inference_steps": 20}')
    browser.find_element("id", "chat-attach").send_keys(str(upload))
    wait_for(browser, 10, lambda d: d.find_elements("css selector", "#chat-attachments .chip"), "the attachment chip")
    browser.find_element("id", "chat-send").click()
    answer = wait_for(
        browser, 120, lambda d: d.find_elements("css selector", ".msg.assistant[data-done=true]"), "the answer"
    )[0]
    no_error(browser)
    got = answer.find_element("tag name", "img").get_attribute("src")
    url = "data:image/png;base64," + base64.b64encode(source).decode()
    ask = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a red circle"}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
        "seed": 5,
        "num_inference_steps": 20,
    }
    with httpx.Client(base_url=demo_server, timeout=120) as c:
        r = c.post("/v1/chat/completions", json=ask)
        plain = c.post("/v1/chat/completions", json={**ask, "messages": [{"role": "user", "content": "a red circle"}]})
    assert r.status_code == 200, r.text
    want = r.json()["choices"][0]["message"]["content"][0]["image_url"]["url"]
    without = plain.json()["choices"][0]["message"]["content"][0]["image_url"]["url"]
    assert np.array_equal(pixels(data_url_bytes(got)), pixels(data_url_bytes(want)))
    assert not np.array_equal(pixels(data_url_bytes(want)), pixels(data_url_bytes(without)))  # the image was used
    assert browser.find_elements("css selector", "#chat-attachments .chip") == []  # sent, so cleared
    screenshot(browser, "playground-chat-image.png")


# --------------------------------------------------------------------------- speech


@pytest.mark.vllm
def test_speech_streams_into_a_playable_audio_element(tts_srv, browser):
    frames = 40  # the tiny codec: 2 tokens a frame, 320 samples a frame at 16 kHz
    knobs = {"temperature": 0, "max_tokens": 2 * frames, "min_tokens": 2 * frames}
    with tts_srv.client(timeout=120) as c:
        card = c.get("/v1/models").json()["data"][0]
        whole = c.post("/v1/audio/speech", json={"input": "good morning", "voice": "bass", **knobs})
        # the same samples as 16-bit PCM the way the stream encodes them (a WAV file scales by 2^15, PCM by 2^15-1)
        pcm = c.post(
            "/v1/audio/speech", json={"input": "good morning", "voice": "bass", "response_format": "pcm", **knobs}
        )
    assert card["routes"] == ["audio.speech"] and card["voices"] == ["alto", "bass"] and card["sample_rate"] == 16000
    want = np.frombuffer(pcm.content, "<i2")
    assert want.shape == (frames * 320,)

    open_page(browser, tts_srv.url, "tiny-tts", "tab-speech")
    assert visible_tabs(browser) == ["tab-speech"]
    voice = Select(browser.find_element("id", "voice"))
    assert [o.text for o in voice.options] == ["alto", "bass"]
    voice.select_by_value("bass")
    fill(browser, "speech-input", "good morning")
    fill(browser, "speech-extra", '{"temperature": 0, "max_tokens": 80, "min_tokens": 80}')
    browser.find_element("id", "speech-go").click()
    audio = browser.find_element("id", "speech-audio")
    wait_for(
        browser,
        120,
        lambda d: d.execute_script("return arguments[0].readyState >= 1 && arguments[0].duration", audio),
        "the <audio> element to load the streamed speech",
    )
    no_error(browser)
    assert abs(browser.execute_script("return arguments[0].duration", audio) - frames * 320 / 16000) < 1e-3
    # playable: play() starts it and time moves on
    assert (
        browser.execute_async_script(
            "const [a, done] = arguments; a.play().then(() => done(true), (e) => done(String(e)))", audio
        )
        is True
    )
    wait_for(
        browser, 10, lambda d: d.execute_script("return arguments[0].currentTime > 0", audio), "playback to advance"
    )
    got, got_rate = soundfile.read(io.BytesIO(element_bytes(browser, audio)), dtype="int16")
    assert got_rate == 16000 and got.shape == want.shape
    # the same greedy codes; streamed pieces decode to the whole clip up to float rounding (one 16-bit step)
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1
    rows = metrics_rows(browser)
    assert list(rows) == ["0", "1"] and rows["0"]["Tokens"] == str(2 * frames)
    assert "first audio" in browser.find_element("id", "speech-info").text
    screenshot(browser, "playground-speech.png")

    # not streamed: the page plays the WAV the server sends, metrics from its X-Stage-Metrics header
    streamed = audio.get_attribute("src")
    browser.find_element("id", "speech-stream").click()
    browser.find_element("id", "speech-go").click()
    wait_for(
        browser,
        120,
        lambda d: d.execute_script(
            "return arguments[0].readyState >= 1 && arguments[0].src.startsWith('blob:') && arguments[0].src !== arguments[1]",
            audio,
            streamed,
        ),
        "the non-streamed speech",
    )
    no_error(browser)
    # the WAV the server sends for this request; an earlier request for the same speech may differ by one 16-bit
    # step where its codec windows were batched or cut differently (float rounding, models/shared/codec_lm/decoder.py)
    played = element_bytes(browser, audio)
    assert played[:44] == whole.content[:44] and len(played) == len(whole.content)
    a, b = (soundfile.read(io.BytesIO(x), dtype="int16")[0].astype(np.int32) for x in (played, whole.content))
    assert np.abs(a - b).max() <= 1
    assert list(metrics_rows(browser)) == ["0", "1"]


# --------------------------------------------------------------------------- video


def test_video_job_progress_then_player(wan_srv, browser):
    open_page(browser, wan_srv.url, "tiny-wan", "tab-video")
    assert visible_tabs(browser) == ["tab-chat", "tab-video"]
    Select(browser.find_element("id", "video-size")).select_by_value("64x64")
    fill(browser, "video-frames", "9")
    fill(browser, "video-steps", "80")
    fill(browser, "video-seed", "1")
    browser.find_element("id", "video-go").click()
    progress = browser.find_element("id", "video-progress")
    seen, deadline = [], time.monotonic() + 180
    while time.monotonic() < deadline:
        seen.append(int(progress.get_attribute("value")))
        if (
            browser.find_element("id", "status").text.startswith("video ready")
            or browser.find_element("id", "error").is_displayed()
        ):
            break
        time.sleep(0.05)
    seen.append(int(progress.get_attribute("value")))  # the bar as the page left it (read after the status)
    no_error(browser)
    assert seen[-1] == 100 and any(0 < p < 100 for p in seen), seen
    assert seen == sorted(seen)
    video = browser.find_element("id", "result-video")
    wait_for(
        browser,
        30,
        lambda d: d.execute_script("return arguments[0].readyState >= 2", video),
        "the <video> element to load",
    )
    assert browser.execute_script("return arguments[0].error", video) is None
    assert browser.execute_script("return [arguments[0].videoWidth, arguments[0].videoHeight]", video) == [64, 64]
    summary = browser.find_element("id", "metrics-summary").text
    job_id = summary.split("job ")[1].split()[0]
    with wan_srv.client() as c:
        job = c.get(f"/v1/videos/{job_id}").json()
        mp4 = c.get(f"/v1/videos/{job_id}/content").content
    assert job["status"] == "completed" and job["stage_metrics"]["0"]["num_steps"] == 80
    assert element_bytes(browser, video) == mp4  # the player holds the job's MP4
    rows = metrics_rows(browser)
    assert list(rows) == ["0"] and rows["0"]["Steps"] == "80"
    screenshot(browser, "playground-video.png")


def test_errors_are_shown_as_the_server_words_them(wan_srv, browser):
    open_page(browser, wan_srv.url, "tiny-wan", "tab-video")
    Select(browser.find_element("id", "video-size")).select_by_value("64x64")
    box = browser.find_element("id", "error")

    # refused when the job is created: a 400 naming the field
    fill(browser, "video-steps", "0")
    browser.find_element("id", "video-go").click()
    wait_for(browser, 30, lambda d: box.is_displayed(), "the error box")
    with wan_srv.client() as c:
        r = c.post("/v1/videos", json={"prompt": "x", "num_inference_steps": 0})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "num_inference_steps"
    assert box.text == f"Error 400: {err['message']} (field: num_inference_steps)"
    screenshot(browser, "playground-error.png")

    # the model's own check (past the tiny Wan's rotary table: 125 frames at most) also answers the job's POST (no job is made): its 400
    fill(browser, "video-steps", "2")
    fill(browser, "video-frames", "129")
    browser.find_element("id", "video-go").click()
    wait_for(browser, 60, lambda d: "exceeds" in box.text, "the model's refusal")
    with wan_srv.client() as c:
        r = c.post("/v1/videos", json={"prompt": "x", "num_inference_steps": 2, "num_frames": 129, "size": "64x64"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "num_frames" and "exceeds" in err["message"]
    assert box.text == f"Error 400: {err['message']} (field: num_frames)"
