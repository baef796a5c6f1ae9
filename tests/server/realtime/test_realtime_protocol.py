"""/v1/realtime, the protocol (servers: conftest.py): the official openai client's realtime connection against the
chat route for the same conversation, every malformed frame answered by an ``error`` naming the event and field
(the session goes on), the bounded input buffer, refusals before any work (API key, model, session limit) and
sessions closed at their time limits. Responses over time (cancel, barge-in, VAD, concurrency, memory):
test_realtime_turns.py."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import websockets

from tests.server.realtime.helpers import EVENT_LIMIT, KEY, user_text, wait_open_zero
from tests.server.realtime_client import (
    b64,
    chat_stream,
    next_event,
    openai_client,
    pcm16_bytes,
    read_reply,
    ws_url,
)


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
    text, pcm = chat_stream(
        srv.url, KEY, [{"role": "user", "content": "hello there world"}], modalities=["text", "audio"]
    )
    assert reply.status == "completed" and not reply.errors
    assert reply.text == text == "echo hello there world" and reply.transcript_done == text
    assert len(reply.pcm) > 0 and reply.pcm == pcm
    assert reply.types[:4] == [
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert reply.types[-1] == "response.done" and "response.output_audio.done" in reply.types
    done = reply.done.response
    assert done.output[0].content[0].transcript == text and done.output[0].status == "completed"
    assert done.usage.output_tokens == 4 and done.usage.input_tokens > 0


async def test_text_modality_and_instructions(srv):
    async with openai_client(srv.url, KEY).realtime.connect(model="test_omni") as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "instructions": "be brief",
                "extra_body": {"max_tokens": 2},
            }
        )
        updated = await next_event(conn, "session.updated")
        assert updated.session.output_modalities == ["text"] and updated.session.instructions == "be brief"
        await conn.conversation.item.create(item=user_text("one two three"))
        await conn.response.create()
        reply = await read_reply(conn)
    text, pcm = chat_stream(
        srv.url,
        KEY,
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three"}],
        modalities=["text"],
        max_tokens=2,
    )
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
        (
            ev(type="input_audio_buffer.append", event_id="e5", audio=b64(b"\x01\x02\x03")),
            "invalid_value",
            "audio",
            "e5",
        ),  # not whole 16-bit samples
        (
            ev(type="session.update", event_id="e6", session={"type": "realtime", "output_modalities": "text"}),
            "invalid_value",
            "session.output_modalities",
            "e6",
        ),
        (
            ev(
                type="session.update", event_id="e7", session={"type": "realtime", "extra_body": {"temperature": "hot"}}
            ),
            "invalid_value",
            "session.extra_body.temperature",
            "e7",
        ),
        (
            ev(
                type="session.update",
                event_id="e8",
                session={"type": "realtime", "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
            ),
            "unsupported_value",
            "session.audio.input.turn_detection.type",
            "e8",
        ),
        (
            ev(
                type="session.update",
                event_id="e8b",
                session={
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}},
                },
            ),
            "invalid_value",
            "session.audio.input.turn_detection.threshold",
            "e8b",
        ),
        (
            ev(
                type="session.update",
                event_id="e9",
                session={"type": "realtime", "audio": {"output": {"voice": "zed"}}},
            ),
            "invalid_value",
            "session.audio.output.voice",
            "e9",
        ),
        (
            ev(
                type="conversation.item.create",
                event_id="e10",
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": 7}]},
            ),
            "invalid_value",
            "item.content[0].text",
            "e10",
        ),
        (
            ev(
                type="conversation.item.create",
                event_id="e11",
                item={"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "%%%"}]},
            ),
            "invalid_value",
            "item.content[0].audio",
            "e11",
        ),
        (ev(type="conversation.item.delete", event_id="e12", item_id="nope"), "item_not_found", "item_id", "e12"),
        (ev(type="input_audio_buffer.commit", event_id="e13"), "input_audio_buffer_commit_empty", None, "e13"),
        (ev(type="response.cancel", event_id="e14"), "response_cancel_not_active", None, "e14"),
        (ev(type="response.create", event_id="e15"), "conversation_empty", None, "e15"),
        (
            ev(type="conversation.item.truncate", event_id="e16", item_id="x", content_index=0, audio_end_ms=0),
            "unsupported_event",
            "type",
            "e16",
        ),
        (ev(type="input_audio_buffer.append", event_id="e17", audio="A" * EVENT_LIMIT), "event_too_large", None, None),
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


async def test_a_browser_sends_the_key_as_a_subprotocol(srv):
    """A browser cannot set headers on a WebSocket: the key comes as OpenAI's browser clients send it, and the
    server answers with the "realtime" subprotocol (a browser drops a connection that names none)."""
    async with websockets.connect(ws_url(srv.url), subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert json.loads(await ws.recv())["type"] == "session.created"
    async with websockets.connect(ws_url(srv.url), subprotocols=["realtime", "openai-insecure-api-key.wrong"]) as ws:
        ev = json.loads(await ws.recv())
        assert ev["type"] == "error" and ev["error"]["code"] == "invalid_api_key"
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1008


# ------------------------------------------------------------------------------------------- session time


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
            except TimeoutError:
                pass
            except websockets.ConnectionClosed:
                break
        assert codes == ["session_expired"]
    assert await wait_open_zero(brief)
