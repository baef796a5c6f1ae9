"""/v1/realtime over a real server (uvicorn in this process) serving the test omni pipeline (a word-by-word
``llm`` stage and a streamed tone stage): the official openai client's realtime connection against the chat
route for the same conversation, every malformed frame answered by an ``error`` naming the event and field
(the session goes on), the API key, the session and buffer limits, and cancel / disconnect aborting the
request in every stage."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import websockets

from tests.server.conftest import new_engine
from tests.server.pipelines import GATE, omni_pipeline
from tests.server.realtime_client import (
    b64,
    chat_stream,
    next_event,
    openai_client,
    pcm16_bytes,
    quiet,
    read_reply,
    voiced,
    ws_url,
)

KEY = "sk-realtime-test"
EVENT_LIMIT = 64 << 10
BUFFER_S = 4.0  # seconds: a VAD turn below fits, five appends of 0.9 s do not


@pytest.fixture(scope="module")
def srv(server_factory):
    GATE.clear()
    return server_factory(new_engine(omni_pipeline()), api_key=KEY, max_realtime_sessions=2,
                          realtime_max_event_bytes=EVENT_LIMIT, realtime_max_buffer_s=BUFFER_S)


def user_text(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def wait_idle(srv, timeout: float = 10.0) -> dict:
    """Stage stats once nothing runs or waits in any stage (or as they are when ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = srv.engine.stage_stats()
        if all(s.running == 0 and s.queue_depth == 0 for s in stats.values()) or time.monotonic() > deadline:
            return {sid: (s.running, s.queue_depth) for sid, s in stats.items()}
        await asyncio.sleep(0.02)


async def test_a_text_turn_speaks_what_the_chat_route_says(srv):
    async with openai_client(srv.url, KEY).realtime.connect(model="test_omni") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.output_modalities == ["audio"]  # the model speaks: audio + transcript
        await conn.conversation.item.create(item=user_text("hello there world"))
        added = await next_event(conn, "conversation.item.added")
        assert added.item.role == "user" and added.item.content[0].text == "hello there world"
        await next_event(conn, "conversation.item.done")
        await conn.response.create()
        reply = await read_reply(conn)
    text, pcm = chat_stream(srv.url, KEY, [{"role": "user", "content": "hello there world"}],
                            modalities=["text", "audio"])
    assert reply.status == "completed" and not reply.errors
    assert reply.text == text == "echo hello there world" and reply.transcript_done == text
    assert len(reply.pcm) > 0 and reply.pcm == pcm
    assert reply.types[:4] == ["response.created", "response.output_item.added", "conversation.item.added",
                               "response.content_part.added"]
    assert reply.types[-1] == "response.done" and "response.output_audio.done" in reply.types
    done = reply.done.response
    assert done.output[0].content[0].transcript == text and done.output[0].status == "completed"
    assert done.usage.output_tokens == 4 and done.usage.input_tokens > 0


async def test_text_modality_and_instructions(srv):
    async with openai_client(srv.url, KEY).realtime.connect(model="test_omni") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "instructions": "be brief", "extra_body": {"max_tokens": 2}})
        updated = await next_event(conn, "session.updated")
        assert updated.session.output_modalities == ["text"] and updated.session.instructions == "be brief"
        await conn.conversation.item.create(item=user_text("one two three"))
        await conn.response.create()
        reply = await read_reply(conn)
    text, pcm = chat_stream(srv.url, KEY, [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "one two three"}],
                            modalities=["text"], max_tokens=2)
    assert reply.text == text == "echo one" and reply.text_done == text and reply.pcm == b"" == pcm
    assert reply.status == "incomplete" and reply.done.response.status_details.reason == "max_output_tokens"


async def test_conversation_items_can_be_deleted_and_inserted(srv):
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        await conn.conversation.item.create(item={**user_text("first"), "id": "a"})
        await conn.conversation.item.create(item={**user_text("last"), "id": "b"})
        await conn.conversation.item.create(item={**user_text("middle"), "id": "c"}, previous_item_id="a")
        added = [await next_event(conn, "conversation.item.added") for _ in range(3)]
        assert [(e.item.id, e.previous_item_id) for e in added] == [("a", None), ("b", "a"), ("c", "a")]
        await conn.conversation.item.delete(item_id="b")
        assert (await next_event(conn, "conversation.item.deleted")).item_id == "b"
        await conn.response.create()  # the last user item is now "middle"
        reply = await read_reply(conn)
    assert reply.text == "echo middle"


# ------------------------------------------------------------------------------------------- malformed


def frames() -> list[tuple[str, str, str | None, str | None]]:
    """(frame, error code, param, event_id the error names)."""
    ev = lambda **kw: json.dumps(kw)  # noqa: E731
    return [
        ("not json {", "invalid_json", None, None),
        ("[1, 2]", "invalid_event", None, None),
        (ev(event_id="e1"), "invalid_event", "type", "e1"),
        (ev(type="session.nope", event_id="e2"), "invalid_event_type", "type", "e2"),
        (ev(type="input_audio_buffer.append", event_id="e3", audio="@@not base64@@"), "invalid_value", "audio", "e3"),
        (ev(type="input_audio_buffer.append", event_id="e4", audio=5), "invalid_value", "audio", "e4"),
        (ev(type="input_audio_buffer.append", event_id="e5", audio=b64(b"\x01\x02\x03")), "invalid_value", "audio",
         "e5"),  # not whole 16-bit samples
        (ev(type="session.update", event_id="e6", session={"type": "realtime", "output_modalities": "text"}),
         "invalid_value", "session.output_modalities", "e6"),
        (ev(type="session.update", event_id="e7", session={"type": "realtime", "extra_body": {"temperature": "hot"}}),
         "invalid_value", "session.extra_body.temperature", "e7"),
        (ev(type="session.update", event_id="e8", session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "semantic_vad"}}}}), "unsupported_value",
         "session.audio.input.turn_detection.type", "e8"),
        (ev(type="session.update", event_id="e8b", session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "threshold": 2}}}}), "invalid_value",
         "session.audio.input.turn_detection.threshold", "e8b"),
        (ev(type="session.update", event_id="e9", session={"type": "realtime", "audio": {"output": {"voice": "zed"}}}),
         "invalid_value", "session.audio.output.voice", "e9"),
        (ev(type="conversation.item.create", event_id="e10", item={"type": "message", "role": "user",
                                                                    "content": [{"type": "input_text", "text": 7}]}),
         "invalid_value", "item.content[0].text", "e10"),
        (ev(type="conversation.item.create", event_id="e11", item={"type": "message", "role": "user", "content": [
            {"type": "input_audio", "audio": "%%%"}]}), "invalid_value", "item.content[0].audio", "e11"),
        (ev(type="conversation.item.delete", event_id="e12", item_id="nope"), "item_not_found", "item_id", "e12"),
        (ev(type="input_audio_buffer.commit", event_id="e13"), "input_audio_buffer_commit_empty", None, "e13"),
        (ev(type="response.cancel", event_id="e14"), "response_cancel_not_active", None, "e14"),
        (ev(type="response.create", event_id="e15"), "conversation_empty", None, "e15"),
        (ev(type="conversation.item.truncate", event_id="e16", item_id="x", content_index=0, audio_end_ms=0),
         "unsupported_event", "type", "e16"),
        (ev(type="input_audio_buffer.append", event_id="e17", audio="A" * EVENT_LIMIT), "event_too_large", None,
         None),
    ]


async def test_each_malformed_frame_gets_an_error_and_the_session_answers_the_next_turn(srv):
    headers = {"Authorization": f"Bearer {KEY}"}
    async with websockets.connect(ws_url(srv.url), additional_headers=headers, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for frame, code, param, event_id in frames():
            await ws.send(frame)
            ev = json.loads(await ws.recv())
            assert ev["type"] == "error", (frame[:80], ev)
            err = ev["error"]
            assert (err["code"], err["param"], err["event_id"]) == (code, param, event_id), (frame[:80], err)
            assert err["message"]
        await ws.send(json.dumps({"type": "conversation.item.create", "item": user_text("still here")}))
        await ws.send(json.dumps({"type": "response.create"}))
        kinds, text = [], ""
        while not kinds or kinds[-1] != "response.done":
            ev = json.loads(await ws.recv())
            kinds.append(ev["type"])
            if ev["type"] == "response.output_audio_transcript.delta":
                text += ev["delta"]
        assert ev["response"]["status"] == "completed" and text == "echo still here"
        assert "error" not in kinds


async def test_the_input_audio_buffer_is_bounded(srv):
    rate = 24000
    half = pcm16_bytes(np.zeros(int(0.9 * rate), dtype=np.float32))  # 0.9 s: five exceed BUFFER_S
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        for _ in range(4):
            await conn.input_audio_buffer.append(audio=b64(half))
        await conn.input_audio_buffer.append(audio=b64(half), event_id="too-much")
        err = (await next_event(conn, "error")).error
        assert (err.code, err.param, err.event_id) == ("input_audio_buffer_full", "audio", "too-much")
        await conn.input_audio_buffer.commit()  # what was buffered before the refusal is kept
        committed = await next_event(conn, "input_audio_buffer.committed")
        added = await next_event(conn, "conversation.item.added")
        assert added.item.id == committed.item_id and added.item.content[0].type == "input_audio"
        await conn.input_audio_buffer.append(audio=b64(half))
        await conn.input_audio_buffer.clear()
        await next_event(conn, "input_audio_buffer.cleared")
        await conn.input_audio_buffer.commit(event_id="empty")
        assert (await next_event(conn, "error")).error.code == "input_audio_buffer_commit_empty"


# ------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
async def test_no_or_wrong_key_is_refused_with_a_close_code_before_any_work(srv, headers):
    opened = srv.state.realtime.opened._value.get()
    async with websockets.connect(ws_url(srv.url), additional_headers=headers) as ws:
        ev = json.loads(await ws.recv())
        assert ev["type"] == "error" and ev["error"]["code"] == "invalid_api_key"
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1008
    assert srv.state.realtime.opened._value.get() == opened  # no session was set up


async def test_the_official_client_with_a_wrong_key_hears_why(srv):
    async with openai_client(srv.url, "wrong").realtime.connect() as conn:
        ev = await conn.recv()
        assert ev.type == "error" and ev.error.code == "invalid_api_key"


async def test_an_unknown_model_is_refused(srv):
    async with openai_client(srv.url, KEY).realtime.connect(model="gpt-realtime") as conn:
        ev = await conn.recv()
        assert ev.type == "error" and ev.error.param == "model" and ev.error.code == "model_not_found"


async def test_sessions_beyond_max_realtime_sessions_are_refused(srv):
    client = openai_client(srv.url, KEY)
    async with client.realtime.connect() as a, client.realtime.connect() as b:
        await next_event(a, "session.created")
        await next_event(b, "session.created")
        async with websockets.connect(ws_url(srv.url), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            ev = json.loads(await ws.recv())
            assert ev["type"] == "error" and ev["error"]["code"] == "session_limit_reached"
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            assert ws.close_code == 1013
    deadline = time.monotonic() + 5
    while srv.state.realtime.open and time.monotonic() < deadline:  # the closed sessions are let go
        await asyncio.sleep(0.02)
    async with client.realtime.connect() as c:
        assert (await c.recv()).type == "session.created"
        metrics = httpx.get(f"{srv.url}/metrics").text  # sessions and events are counted
        assert 'omnistage_realtime_sessions_refused_total{reason="max_sessions"} 1.0' in metrics
        assert "omnistage_realtime_sessions_active 1.0" in metrics
        assert 'omnistage_realtime_events_total{direction="out",type="session.created"}' in metrics


# ------------------------------------------------------------------------------------------- cancel


async def test_cancel_mid_response_aborts_every_stage_and_keeps_what_was_sent(srv):
    aborted = srv.state.metrics.aborted._value.get()
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        await conn.conversation.item.create(item=user_text("block: never finishes"))
        await conn.response.create()

        async def cancel_on_first_delta(ev, reply):
            if ev.type == "response.output_audio_transcript.delta" and reply.text == "":
                await conn.response.create(event_id="second")  # one response at a time
                await conn.response.cancel()

        reply = await read_reply(conn, cancel_on_first_delta)
        assert reply.status == "cancelled" and reply.done.response.status_details.reason == "client_cancelled"
        assert [e.code for e in reply.errors] == ["conversation_already_has_active_response"]
        assert reply.text == "echo" and reply.done.response.output[0].content[0].transcript == "echo"
        assert reply.done.response.output[0].status == "incomplete"
        assert await wait_idle(srv) == {0: (0, 0), 1: (0, 0), 2: (0, 0), 3: (0, 0)}
        assert srv.state.metrics.aborted._value.get() == aborted + 1
        await conn.conversation.item.create(item=user_text("next turn"))  # the session goes on
        await conn.response.create()
        assert (await read_reply(conn)).text == "echo next turn"


async def test_a_disconnect_mid_response_aborts_every_stage(srv):
    aborted = srv.state.metrics.aborted._value.get()
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        await conn.conversation.item.create(item=user_text("block: left behind"))
        await conn.response.create()
        await next_event(conn, "response.output_audio_transcript.delta")
    assert await wait_idle(srv) == {0: (0, 0), 1: (0, 0), 2: (0, 0), 3: (0, 0)}
    deadline = time.monotonic() + 5
    while srv.state.realtime.open and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert srv.state.realtime.open == 0 and srv.state.metrics.aborted._value.get() == aborted + 1


# ------------------------------------------------------------------------------------------- server VAD


def vad_session(rate: int, **vad) -> dict:
    return {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate},
                                                    "turn_detection": {"type": "server_vad", **vad}}}}


async def stream_audio(conn, x: np.ndarray, rate: int, chunk_s: float = 0.1) -> None:
    pcm = pcm16_bytes(x)
    step = int(chunk_s * rate) * 2
    for i in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=b64(pcm[i:i + step]))


@pytest.mark.parametrize("rate", [16000, 24000])  # 24 kHz: resampled for the detector
async def test_server_vad_finds_the_turn_between_silences_and_answers_it(srv, rate):
    clip = np.concatenate([quiet(1.0, rate), voiced(1.5, rate), quiet(1.5, rate)])
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        await conn.session.update(session=vad_session(rate, prefix_padding_ms=300, silence_duration_ms=500))
        td = (await next_event(conn, "session.updated")).session.audio.input.turn_detection
        assert (td.type, td.threshold, td.create_response) == ("server_vad", 0.5, True)
        await stream_audio(conn, clip, rate)
        started = await next_event(conn, "input_audio_buffer.speech_started")
        stopped = await next_event(conn, "input_audio_buffer.speech_stopped")
        committed = await next_event(conn, "input_audio_buffer.committed")
        added = await next_event(conn, "conversation.item.added")
        reply = await read_reply(conn)  # create_response: the server answers the turn by itself
    assert abs(started.audio_start_ms - (1000 - 300)) <= 90  # speech onset less prefix_padding_ms
    assert abs(stopped.audio_end_ms - 2500) <= 120
    assert started.item_id == stopped.item_id == committed.item_id == added.item.id
    assert reply.status == "completed" and reply.text == "echo"  # (the word stage hears no audio)


async def test_quiet_alone_is_no_turn(srv):
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        await conn.session.update(session=vad_session(16000))
        await next_event(conn, "session.updated")
        await stream_audio(conn, quiet(3.0, 16000), 16000)
        await conn.input_audio_buffer.clear()  # a marker: everything before it has been handled
        ev = await conn.recv()
        assert ev.type == "input_audio_buffer.cleared", ev.type


async def test_speech_during_a_response_barges_in(srv):
    rate = 16000
    async with openai_client(srv.url, KEY).realtime.connect() as conn:
        await conn.session.update(session=vad_session(rate))
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(item=user_text("block: talk forever"))
        await conn.response.create()
        await next_event(conn, "response.output_audio_transcript.delta")
        await stream_audio(conn, np.concatenate([voiced(1.0, rate), quiet(1.0, rate)]), rate)
        kinds = []
        while "response.done" not in kinds:
            ev = await conn.recv()
            kinds.append(ev.type)
        assert kinds.index("input_audio_buffer.speech_started") < kinds.index("response.done")
        assert ev.response.status == "cancelled" and ev.response.status_details.reason == "turn_detected"
        assert ev.response.output[0].content[0].transcript == "echo"  # what was sent before the barge-in
        assert await wait_idle(srv) == {0: (0, 0), 1: (0, 0), 2: (0, 0), 3: (0, 0)}
        await next_event(conn, "input_audio_buffer.speech_stopped")
        reply = await read_reply(conn)  # the new turn is answered
        assert reply.status == "completed" and reply.text == "echo"


# ------------------------------------------------------------------------------------------- session time


@pytest.fixture(scope="module")
def short(server_factory):
    """Servers whose sessions end soon: one closes them idle after 0.5 s, one when 1 s old."""
    idle = server_factory(new_engine(omni_pipeline()), api_key=KEY, realtime_idle_timeout_s=0.5)
    brief = server_factory(new_engine(omni_pipeline()), api_key=KEY, realtime_max_session_s=1.0)
    return idle, brief


async def close_code_after_error(url: str) -> tuple[str, int]:
    """Open a session, stay quiet until the server ends it: (error code, close code)."""
    async with websockets.connect(ws_url(url), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        ev = json.loads(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        return ev["error"]["code"], ws.close_code


async def test_an_idle_session_is_closed(short):
    code, close = await close_code_after_error(short[0].url)
    assert (code, close) == ("idle_timeout", 1008)


async def test_a_session_past_its_length_is_closed_even_while_talking(short):
    brief = short[1]
    async with openai_client(brief.url, KEY).realtime.connect() as conn:
        await next_event(conn, "session.created")
        codes = []
        for _ in range(100):  # an event every 0.1 s, until the server ends the session
            try:
                await conn.input_audio_buffer.append(audio=b64(b"\x00\x00" * 1600))
            except websockets.ConnectionClosed:  # closing: what the server sent before is still to be read
                pass
            try:
                ev = await asyncio.wait_for(conn.recv(), 0.1)
                codes.append(ev.error.code if ev.type == "error" else ev.type)
            except asyncio.TimeoutError:
                pass
            except websockets.ConnectionClosed:
                break
        assert codes == ["session_expired"]
    assert await wait_open_zero(brief)


async def wait_open_zero(srv) -> bool:
    deadline = time.monotonic() + 5
    while srv.state.realtime.open and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return srv.state.realtime.open == 0


# ------------------------------------------------------------------------------------------- concurrency


async def test_eight_concurrent_sessions_each_get_their_own_answer(server_factory):
    wide = server_factory(new_engine(omni_pipeline()), api_key=KEY)

    async def talk(i: int):
        async with openai_client(wide.url, KEY).realtime.connect() as conn:
            await conn.conversation.item.create(item=user_text(f"session {i} says " + " ".join(["la"] * i)))
            await conn.response.create()
            return await read_reply(conn)

    replies = await asyncio.gather(*(talk(i) for i in range(8)))
    for i, reply in enumerate(replies):
        text, pcm = chat_stream(wide.url, KEY, [{"role": "user", "content": f"session {i} says " + " ".join(["la"] * i)}],
                                modalities=["text", "audio"])
        assert reply.status == "completed" and reply.text == text and reply.pcm == pcm


async def test_memory_stays_flat_over_many_short_sessions(server_factory):
    """200 sessions with a turn each leave nothing behind: the process's RSS (server and client: one client
    for all sessions) grows by less than 16 MiB after a warm-up (measured ~1 MiB; a session kept alive by
    mistake would hold its audio, conversation and response task)."""
    import gc

    import psutil

    srv = server_factory(new_engine(omni_pipeline()), api_key=KEY)
    audio = b64(pcm16_bytes(quiet(0.5, 24000)))

    client = openai_client(srv.url, KEY)

    async def session(i: int) -> None:
        async with client.realtime.connect() as conn:
            await conn.input_audio_buffer.append(audio=audio)
            await conn.input_audio_buffer.commit()
            await conn.conversation.item.create(item=user_text(f"turn {i}"))
            await conn.response.create()
            assert (await read_reply(conn)).status == "completed"

    async def many(n: int) -> None:
        for start in range(0, n, 10):
            await asyncio.gather(*(session(start + i) for i in range(10)))

    await many(100)  # warm-up: thread pools, allocator arenas, caches
    gc.collect()
    before = psutil.Process().memory_info().rss
    await many(200)
    assert await wait_open_zero(srv)
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.1f} MiB over 200 sessions"
