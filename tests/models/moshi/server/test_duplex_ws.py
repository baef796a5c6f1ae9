"""The duplex WebSocket (``/v1/realtime?duplex=1``, ``/v1/duplex``) with a plain ``websockets`` client: greedy
frames equal the authors' step loop (goldens: tests/models/moshi/conftest.py), a resumed session equals an
unbroken one, bad input is an error event naming it and the session goes on, the API key is enforced."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import deque

import numpy as np
import pytest
import websockets

from tests.models.moshi.conftest import PCM_ATOL, PERSONA_PARAMS, golden
from tests.models.moshi.server.conftest import GRACE_S, KEY

FRAME = 1920
pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0, "temperature_text": 0}
# the reference's float samples and ours differ by PCM_ATOL at most; PCM16 on the wire rounds each to 1/32768
WIRE_ATOL = PCM_ATOL + 1 / 32768


def url(srv, path: str = "/v1/realtime?duplex=1") -> str:
    return srv.url.replace("http", "ws", 1) + path


def b64pcm(pcm: np.ndarray) -> str:
    return base64.b64encode(np.round(pcm * 32768).astype("<i2").tobytes()).decode()


async def connect(srv, path: str = "/v1/realtime?duplex=1", key: str | None = KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return await websockets.connect(url(srv, path), additional_headers=headers, max_size=None)


async def send(ws, kind: str, **fields) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def events_until(ws, kind: str, seen: list[dict], timeout: float = 120) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        seen.append(event)
        if event["type"] == kind:
            return event


async def append_all(ws, pcm: np.ndarray, piece: int) -> None:
    for at in range(0, len(pcm), piece):
        await send(ws, "input_audio_buffer.append", audio=b64pcm(pcm[at : at + piece]))


def check_output(events: list[dict], case: dict) -> None:
    """The session's audio and text (events in sequence order, each once) against the reference's frames."""
    by_seq = {e["server_event_seq"]: e for e in events if "server_event_seq" in e and e["type"] != "session.resumed"}
    ordered = [by_seq[s] for s in sorted(by_seq)]
    assert sorted(by_seq) == list(range(1, len(by_seq) + 1))  # no event lost, none twice
    audio = [e["delta"] for e in ordered if e["type"] == "response.output_audio.delta"]
    assert audio == [e["delta"] for e in ordered if e["type"] == "response.audio.delta"]
    pcm = np.concatenate([np.frombuffer(base64.b64decode(a), "<i2") / 32768 for a in audio])
    wire = np.clip(case["pcm"], -1, 32767 / 32768)  # PCM16 holds [-1, 1): the random tiny model's peaks clip
    np.testing.assert_allclose(pcm, wire, atol=WIRE_ATOL, rtol=0)
    transcript = [e for e in ordered if e["type"] == "response.output_audio_transcript.delta"]
    assert [t for e in transcript for t in e["token_ids"]] == [
        t for t in case["tokens"][:, 0].tolist() if t not in (0, 3)
    ]
    assert "".join(e["delta"] for e in transcript) == str(case["text"])


def test_greedy_duplex_equals_reference(duplex_server):
    case = golden("a")

    async def run():
        events: list[dict] = []
        async with await connect(duplex_server) as ws:
            await send(ws, "session.update", session=GREEDY)
            created = await events_until(ws, "session.created", events)
            caps = created["session"]["capabilities"]
            assert caps["chunk_period_ms"] == 80 and caps["supports_session_resume"]
            assert caps["input_sample_rate"] == caps["output_sample_rate"] == 24000
            await append_all(ws, case["user_pcm"], 5000)
            await send(ws, "session.heartbeat")
            await send(ws, "session.close")
            await events_until(ws, "session.closed", events)
        return events

    check_output(asyncio.run(run()), golden("a"))
    metrics = duplex_server.client().get("/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert "omnistage_duplex_sessions" in metrics and 'omnistage_duplex_step_seconds{sessions="1"}' in metrics
    assert "omnistage_duplex_frames_late_total" in metrics


def test_resume_after_a_dropped_socket_equals_unbroken(duplex_server):
    case = golden("b")
    half = len(case["user_pcm"]) // 2 // FRAME * FRAME

    async def run():
        events: list[dict] = []
        ws = await connect(duplex_server, "/v1/duplex")
        await send(ws, "session.update", session=GREEDY)
        created = (await events_until(ws, "session.created", events))["session"]
        await append_all(ws, case["user_pcm"][:half], FRAME)
        await events_until(ws, "response.output_audio.delta", events)
        acked = events[-1]["server_event_seq"]
        await send(ws, "session.event_ack", last_event_seq=acked)
        await ws.close()  # dropped: the session is paused, its state kept
        await asyncio.sleep(0.5)
        async with await connect(duplex_server, "/v1/duplex") as ws2:
            resume = {"session_id": created["id"], "resume_token": created["resume_token"], "last_event_seq": acked}
            await send(ws2, "session.resume", **resume)
            await events_until(ws2, "session.resumed", events)
            await append_all(ws2, case["user_pcm"][half:], 3000)
            await send(ws2, "session.close")
            await events_until(ws2, "session.closed", events)
        return events

    check_output(asyncio.run(run()), case)


def test_bad_input_is_an_error_event_and_the_session_goes_on(duplex_server):
    case = golden("c")

    async def run():
        events: list[dict] = []
        async with await connect(duplex_server) as ws:
            await send(ws, "session.update", session=dict(GREEDY, input_sample_rate=16000))
            bad_rate = await events_until(ws, "error", events)
            await send(ws, "session.update", session=GREEDY)
            await events_until(ws, "session.created", events)
            errors = []
            for bad in (
                {"type": "input_audio_buffer.append", "audio": "not base64!!"},
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()},
                {"type": "input_audio_buffer.append", "audio": "A" * 700000},
                {"type": "conversation.item.create"},
                {"no": "type"},
            ):
                await ws.send(json.dumps(bad))
                errors.append(await events_until(ws, "error", events))
            await append_all(ws, case["user_pcm"], FRAME * 4)
            await send(ws, "session.close")
            await events_until(ws, "session.closed", events)
        return bad_rate, errors, events

    bad_rate, errors, events = asyncio.run(run())
    assert bad_rate["error"]["param"] == "input_sample_rate"
    assert [e["error"]["param"] for e in errors] == ["audio", "audio", "audio", "type", "type"]
    check_output([e for e in events if e["type"] != "error" or e.get("server_event_seq")], case)


def test_persona_through_session_update(duplex_server):
    """``voice`` and ``instructions`` in ``session.update`` condition the session (PersonaPlex's prompt): its
    transcript equals PersonaPlex's step loop. An unknown voice is an error event, and the socket goes on."""
    case = golden("persona")

    async def run():
        events: list[dict] = []
        async with await connect(duplex_server) as ws:
            await send(ws, "session.update", session=dict(GREEDY, voice="nobody", instructions="Hi."))
            unknown = await events_until(ws, "error", events)
            await send(ws, "session.update", session=dict(GREEDY, persona="a teacher"))
            persona = await events_until(ws, "error", events)
            await send(ws, "session.update", session=dict(GREEDY, **PERSONA_PARAMS))
            await events_until(ws, "session.created", events)
            await append_all(ws, golden("a")["user_pcm"], 5000)
            await send(ws, "session.close")
            await events_until(ws, "session.closed", events)
        return unknown, persona, events

    unknown, persona, events = asyncio.run(run())
    assert unknown["error"]["param"] == "voice" and "tiny" in unknown["error"]["message"]  # names the presets
    assert persona["error"]["param"] == "persona"
    audio = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert len(audio) == len(case["tokens"]) + 1  # the last frame is stepped too (test_duplex.py says why)
    ids = [t for e in events if e["type"] == "response.output_audio_transcript.delta" for t in e["token_ids"]]
    expected = [t for t in case["tokens"][:, 0].tolist() if t not in (0, 3)]
    assert ids[: len(expected)] == expected and len(ids) <= len(expected) + 1


def test_api_key_is_enforced_and_a_chat_socket_is_refused(duplex_server):
    async def run():
        async with await connect(duplex_server, key="wrong") as ws:
            refused = json.loads(await ws.recv())
            await asyncio.wait_for(ws.wait_closed(), 30)
            code = ws.close_code
        async with await connect(duplex_server, "/v1/realtime") as ws:  # not duplex: this model needs it
            turns = json.loads(await ws.recv())
        return refused, code, turns

    refused, code, turns = asyncio.run(run())
    assert refused["error"]["code"] == "invalid_api_key" and code == 1008
    assert turns["error"]["code"] == "unsupported_model" and "duplex" in turns["error"]["message"]


def test_a_dropped_socket_without_resume_frees_its_slot_after_the_grace_period(duplex_server):
    stage = duplex_server.engine.replicas(0)[0]
    case = golden("c")

    async def open_and_drop():
        events: list[dict] = []
        ws = await connect(duplex_server)
        await send(ws, "session.update", session=GREEDY)
        created = (await events_until(ws, "session.created", events))["session"]
        await append_all(ws, case["user_pcm"][: FRAME * 3], FRAME)
        await events_until(ws, "response.output_audio.delta", events)
        await ws.close()
        return created

    created = asyncio.run(open_and_drop())
    dropped = time.monotonic()
    assert stage.slots_held() == 1  # paused, not ended: its state is kept for a resume
    deadline = dropped + GRACE_S + 60  # the grace period, plus a bound that stops a hang
    while stage.slots_held() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stage.slots_held() == 0

    async def late_resume():
        events: list[dict] = []
        async with await connect(duplex_server) as ws:
            resume = {"session_id": created["id"], "resume_token": created["resume_token"], "last_event_seq": 0}
            await send(ws, "session.resume", **resume)
            return await events_until(ws, "error", events)

    assert asyncio.run(late_resume())["error"]["param"] == "resume_token"


def test_admission_refuses_sessions_past_real_time_capacity(tight_server, roomy_server):
    """A budget below every step the engine measured at start-up refuses before the upgrade (429, naming the
    limit). A socket upgraded while there was room and refused at ``session.update`` gets an error event naming
    the limit, and goes on."""
    assert tight_server.engine.replicas(0)[0].step_seconds(1) is not None  # measured at start-up
    with pytest.raises(websockets.InvalidStatus) as before_upgrade:
        asyncio.run(connect(tight_server, "/v1/duplex"))
    response = before_upgrade.value.response
    assert response.status_code == 429
    body = json.loads(response.body)
    assert body["error"]["type"] == "rate_limit_error" and "--duplex-frame-budget-ms" in body["error"]["message"]

    stage = roomy_server.engine.replicas(0)[0]

    async def run():
        events: list[dict] = []
        async with await connect(roomy_server) as ws:
            stage._step_times[1] = deque([3600.0], maxlen=16)  # the room is gone between upgrade and update
            await send(ws, "session.update", session=GREEDY)
            refused = await events_until(ws, "error", events)
            await send(ws, "session.heartbeat")  # no session: the socket still answers, naming what is missing
            return refused, await events_until(ws, "error", events)

    refused, after = asyncio.run(run())
    assert refused["error"]["type"] == "rate_limit_error" and "--duplex-frame-budget-ms" in refused["error"]["message"]
    assert after["error"]["param"] == "type"


def test_clients_that_connect_at_once_are_admitted_one_by_one(roomy_server):
    """Three session.updates at the same moment, with step times saying two sessions fit and three do not:
    admissions run one at a time on the sessions admitted before them, so two are admitted and one is refused
    (checked each on the same count, all three would be admitted). The step times are set for this: the server's
    budget is one no real step reaches, so only the set ones decide."""
    stage = roomy_server.engine.replicas(0)[0]
    stage._step_times.clear()
    for sessions, seconds in ((1, 0.001), (2, 0.001), (3, 3600.0)):
        stage._step_times[sessions] = deque([seconds], maxlen=16)

    async def client(ws) -> str:
        await send(ws, "session.update", session=GREEDY)
        first = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if first["type"] == "session.created":
            return "admitted"
        assert first["type"] == "error" and first["error"]["type"] == "rate_limit_error", first
        return "refused"

    async def run():
        sockets = [await connect(roomy_server) for _ in range(3)]
        try:
            return await asyncio.gather(*(client(ws) for ws in sockets))
        finally:
            for ws in sockets:
                await ws.close()

    assert sorted(asyncio.run(run())) == ["admitted", "admitted", "refused"]
