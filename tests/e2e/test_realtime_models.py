"""/v1/realtime with other kinds of model (``omnistage serve`` subprocesses): a speech model (tiny codec_tts)
speaks a text turn as /v1/audio/speech speaks the same text with the same voice and knobs (greedy: within one
16-bit step); a text chat model (tiny chat) says what its chat route says."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from omnistage.testing.server import ServeProcess
from tests.server.realtime_client import chat_stream, next_event, openai_client, read_reply

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FRAMES = 40  # K=2 tokens per frame, 320 samples per frame at 16 kHz
KEY = "sk-realtime-models"
THINK = 12


@pytest.fixture(scope="module")
def tts(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("rt-tts") / "server.log"
    server = ServeProcess.launch([str(tiny_model("codec_tts")), "--served-model-name", "tiny-tts", "--api-key", KEY,
                                  "--stage-overrides", '{"0": {"max_model_len": 512, "dtype": "float32"}}'], log)
    yield server.url
    server.stop()


async def test_a_text_turn_is_spoken_as_the_speech_route_speaks_it(tts):
    async with openai_client(tts, KEY).realtime.connect(model="tiny-tts") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.output_modalities == ["audio"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]}, event_id="txt")
        err = (await next_event(conn, "error")).error
        assert (err.param, err.event_id) == ("session.output_modalities", "txt")  # it only speaks
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 2 * FRAMES,
                                           "audio": {"output": {"voice": "bass"}},
                                           "extra_body": {"temperature": 0, "min_tokens": 2 * FRAMES}})
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hello world"}]})
        await conn.response.create()
        reply = await read_reply(conn)
    with httpx.Client(base_url=tts, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as client:
        with client.stream("POST", "/v1/audio/speech", json={
                "model": "tiny-tts", "input": "hello world", "voice": "bass", "response_format": "pcm", "stream": True,
                "temperature": 0, "max_tokens": 2 * FRAMES, "min_tokens": 2 * FRAMES}) as r:
            assert r.status_code == 200
            theirs = np.frombuffer(b"".join(r.iter_raw()), "<i2").astype(int)
    ours = np.frombuffer(reply.pcm, "<i2").astype(int)
    assert reply.status == "completed" and not reply.errors
    assert reply.text == "hello world" == reply.transcript_done  # what it spoke
    assert ours.shape == theirs.shape == (FRAMES * 320,)
    assert np.abs(ours - theirs).max() <= 1


@pytest.fixture(scope="module")
def chat_model(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("rt-chat") / "server.log"
    server = ServeProcess.launch([str(tiny_model("chat")), "--served-model-name", "tiny-chat", "--api-key", KEY], log)
    yield server.url
    server.stop()


async def test_a_text_chat_model_over_realtime_says_what_its_chat_route_says(chat_model):
    async with openai_client(chat_model, KEY).realtime.connect(model="tiny-chat") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.output_modalities == ["text"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"]}, event_id="speak")
        err = (await next_event(conn, "error")).error
        assert (err.param, err.event_id) == ("session.output_modalities", "speak")
        await conn.session.update(session={"type": "realtime", "instructions": "You are terse.",
                                           "max_output_tokens": THINK, "extra_body": {"temperature": 0}})
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hello, who are you?"}]})
        await conn.response.create()
        reply = await read_reply(conn)
    text, pcm = chat_stream(chat_model, KEY, [{"role": "system", "content": "You are terse."},
                                              {"role": "user", "content": "hello, who are you?"}],
                            max_tokens=THINK, temperature=0)
    assert reply.text == text and reply.text_done == text and text and pcm == b"" == reply.pcm
    assert reply.status in ("completed", "incomplete") and 0 < reply.done.response.usage.output_tokens <= THINK
