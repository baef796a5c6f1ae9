"""The playground's talk panel (GET /, tab "Talk") in headless Chromium with a fake microphone (Chromium
plays a WAV file as the capture device), against a real server (uvicorn in this process) serving the test
omni pipeline: a word-by-word ``llm`` stage and a streamed tone stage (tests/server/pipelines.py), the server
the realtime protocol tests use.

The page opens /v1/realtime itself (the API key as a subprotocol, as a browser must), streams the microphone
as PCM16, and plays the answer's audio deltas through Web Audio. What the page heard and played is read from
its state and compared with what /v1/chat/completions answers for the same conversation; Stop cancels an
answer in every stage; push to talk commits on release.
"""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
import soundfile
from selenium.webdriver.common.action_chains import ActionChains

from omnistage import AsyncOmni
from tests.e2e.browser import chromium, console_errors, requires_browser, screenshot, wait_for
from tests.e2e.playground_page import no_error, open_page
from tests.server.pipelines import GATE, SAMPLE_RATE, talking_pipeline
from tests.server.realtime_client import chat_stream, quiet, voiced

pytestmark = [pytest.mark.slow, requires_browser]

KEY = "sk-talk"
MIC_RATE = 48000
# what the fake microphone says (looped): 1 s of room noise, 1.5 s of speech-like sound, 2.5 s of room noise
SPEECH_S, PADDING_MS = 1.5, 300


@pytest.fixture(scope="module")
def mic_clip() -> np.ndarray:
    return np.concatenate([quiet(1.0, MIC_RATE), voiced(SPEECH_S, MIC_RATE), quiet(2.5, MIC_RATE)])


@pytest.fixture
def talk_browser(mic_clip, tmp_path):
    wav = tmp_path / "mic.wav"
    soundfile.write(wav, mic_clip, MIC_RATE, subtype="PCM_16")
    with chromium("--use-fake-ui-for-media-stream", f"--use-file-for-fake-audio-capture={wav}") as driver:
        yield driver


@pytest.fixture
def srv(server_factory):
    GATE.clear()  # "block:" prompts wait (until cancelled)
    return server_factory(AsyncOmni(pipeline=talking_pipeline()), api_key=KEY)


def reply_state(driver, i: int) -> dict:
    """The page's record of reply ``i``: status, transcript, the PCM it received, the samples it played."""
    return driver.execute_script(
        """
        const r = talk.replies[arguments[0]];
        if (!r) return null;
        const bytes = new Uint8Array(r.player.chunks.reduce((n, c) => n + c.byteLength, 0));
        let at = 0;
        for (const c of r.player.chunks) { bytes.set(c, at); at += c.byteLength; }
        return {status: r.status, text: r.div.querySelector(".text").textContent, pcm: bytesBase64(bytes),
                played: r.player.played, playing: r.player.playing.size, rate: r.player.rate};""",
        i,
    )


def wait_reply(driver, i: int, status: str, seconds: float = 30) -> dict:
    wait_for(
        driver,
        seconds,
        lambda d: (r := reply_state(d, i)) and r["status"] == status and r["playing"] == 0,
        f"reply {i} {status} and played",
    )
    return reply_state(driver, i)


def wait_idle(srv, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = srv.engine.stage_stats()
        if all(s.running == 0 and s.queue_depth == 0 for s in stats.values()) or time.monotonic() > deadline:
            return {sid: (s.running, s.queue_depth) for sid, s in stats.items()}
        time.sleep(0.02)


def test_talk_hears_the_microphone_plays_the_answer_and_stops_it(srv, talk_browser, mic_clip):
    b = talk_browser
    open_page(b, srv.url + f"/?api_key={KEY}", "test_omni", "tab-video")
    assert "tab-talk" in [t.get_attribute("id") for t in b.find_elements("css selector", ".tab") if t.is_displayed()]
    b.find_element("id", "tab-talk").click()
    b.find_element("id", "talk-start").click()

    # server VAD: the spoken part of the looped clip is one turn, answered by itself. The first turn may be cut
    # (the fake device starts playing its file before the page's audio graph listens): the first whole one counts
    j = wait_for(
        b,
        30,
        lambda d: d.execute_script(
            "const i = talk.turns.findIndex((t) => t.started > 0 && t.stopped !== null); return i >= 0 ? String(i) : null"
        ),
        "a whole spoken turn",
    )
    first = wait_reply(b, int(j), "completed")
    no_error(b)
    turn = b.execute_script("return talk.turns[arguments[0]]", int(j))
    heard_ms = turn["stopped"] - turn["started"]  # the speech, plus prefix_padding_ms before it
    assert abs(heard_ms - (SPEECH_S * 1000 + PADDING_MS)) <= 200, turn
    rate = b.execute_script("return talk.mic.ctx.sampleRate")
    assert b.execute_script("return talk.sentSamples") > rate * (turn["stopped"] / 1000)  # the session's timeline

    # the reference: the chat route for the same conversation (the word stage answers audio with "echo")
    buf = _wav(mic_clip)
    text, pcm = chat_stream(
        srv.url,
        KEY,
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": base64.b64encode(buf).decode(), "format": "wav"}}
                ],
            }
        ],
        modalities=["text", "audio"],
    )
    assert first["text"] == text == "echo"
    got = base64.b64decode(first["pcm"])
    assert got == pcm and len(got) > 0
    assert first["rate"] == SAMPLE_RATE and first["played"] == len(pcm) // 2  # every sample played to the end
    assert b.find_element("css selector", "#talk-log .msg.user .text").text == "(spoken)"

    # push to talk from here on: nothing is heard unless the button is held
    b.find_element("id", "talk-ptt").click()
    wait_for(b, 10, lambda d: d.find_element("id", "talk-hold").is_displayed(), "the hold button")
    time.sleep(0.5)  # the session.update is in; no turn may be pending
    replies = b.execute_script("return talk.replies.length")

    # a typed turn that would never end, stopped by the Stop button: cancelled in every stage
    text_box = b.find_element("id", "talk-text")
    text_box.send_keys("block: talk forever\n")
    wait_for(b, 20, lambda d: (r := reply_state(d, replies)) and r["text"] == "echo", "the first word of the answer")
    b.find_element("id", "talk-stop").click()
    stopped = wait_reply(b, replies, "cancelled")
    assert stopped["text"] == "echo"
    assert wait_idle(srv) == {0: (0, 0), 1: (0, 0), 2: (0, 0), 3: (0, 0)}
    no_error(b)

    # hold, talk, release: the held audio is committed and answered
    hold = b.find_element("id", "talk-hold")
    sent_before = b.execute_script("return talk.sentSamples")
    ActionChains(b).click_and_hold(hold).perform()
    wait_for(b, 10, lambda d: d.execute_script("return talk.heldSamples") >= rate // 2, "half a second of audio held")
    ActionChains(b).release(hold).perform()
    held = wait_reply(b, replies + 1, "completed")
    assert held["text"] == "echo" and base64.b64decode(held["pcm"]) == pcm
    # the page sent the held audio and nothing else: not before the press, not after the release (the reply came
    # meanwhile)
    sent, counted = b.execute_script("return [talk.sentSamples, talk.heldSamples]")
    assert sent - sent_before == counted >= rate // 2
    assert len(b.find_elements("css selector", "#talk-log .msg.user")) >= 3
    screenshot(b, "playground-talk.png")

    b.find_element("id", "talk-start").click()  # hang up: the server lets the session go
    deadline = time.monotonic() + 5
    while srv.state.realtime.open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.state.realtime.open == 0
    assert console_errors(b) == []


def _wav(x: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    soundfile.write(buf, x, MIC_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()
