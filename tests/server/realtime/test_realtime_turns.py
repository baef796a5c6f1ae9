"""/v1/realtime, responses over time (servers: conftest.py): ``response.cancel``, a barge-in and a disconnect
abort the request in every stage (within one step of each), server VAD finds turns and barges in, concurrent
sessions each get their own answer, and memory stays flat over many sessions. The protocol itself:
test_realtime_protocol.py."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from omnistage.info import PipelineInfo, SpeechInfo
from omnistage.pipeline import Edge, Pipeline, StageSpec
from omnistage.stages.generation.engine import GenerationStageEngine
from tests.server.conftest import new_engine
from tests.server.pipelines import ToneAdapter, WordEngine, omni_pipeline, text_chunk
from tests.server.realtime.helpers import (
    IDLE,
    KEY,
    stream_audio,
    user_text,
    vad_session,
    wait_idle,
    wait_open_zero,
)
from tests.server.realtime_client import (
    b64,
    chat_stream,
    next_event,
    openai_client,
    pcm16_bytes,
    quiet,
    read_reply,
    voiced,
)

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
        assert await wait_idle(srv) == IDLE
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
    assert await wait_idle(srv) == IDLE
    deadline = time.monotonic() + 5
    while srv.state.realtime.open and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert srv.state.realtime.open == 0 and srv.state.metrics.aborted._value.get() == aborted + 1


# ------------------------------------------------------------------------------------------- server VAD


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
        assert await wait_idle(srv) == IDLE
        await next_event(conn, "input_audio_buffer.speech_stopped")
        reply = await read_reply(conn)  # the new turn is answered
        assert reply.status == "completed" and reply.text == "echo"


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
        text, pcm = chat_stream(
            wide.url,
            KEY,
            [{"role": "user", "content": f"session {i} says " + " ".join(["la"] * i)}],
            modalities=["text", "audio"],
        )
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


# ------------------------------------------------------------------------------------------- within one step

LOG: list[tuple[str, int, str]] = []  # ("step" | "abort", stage id, request id), in the order they happened


class CountedWords(WordEngine):
    """The word stage, logging each step (a word) as it is taken and each abort as it arrives."""

    async def generate(self, req):
        async for out in super().generate(req):
            if not out.finished:
                LOG.append(("step", self.stage_id, req.request_id))
            yield out

    async def abort(self, request_id: str) -> None:
        LOG.append(("abort", self.stage_id, request_id))
        await super().abort(request_id)


class CountedTone(ToneAdapter):
    def run(self, items):
        LOG.extend(("step", 1, item.request_id) for item in items)  # a step: one streamed chunk turned into audio
        return super().run(items)


class CountedGeneration(GenerationStageEngine):
    async def abort(self, request_id: str) -> None:
        LOG.append(("abort", self.stage_id, request_id))
        await super().abort(request_id)


@pytest.fixture(scope="module")
def counted(server_factory):
    pipeline = Pipeline(
        name="test_counted",
        stages=[
            StageSpec(0, kind="llm", engine=CountedWords, output="text", final=True),
            StageSpec(
                1,
                kind="generation",
                engine=CountedGeneration,
                adapter=CountedTone,
                output="audio",
                final=True,
                inputs=[Edge(0, process=lambda src, req: {"text": src.get("text", "")}, process_chunk=text_chunk)],
            ),
        ],
        info=PipelineInfo(speech=SpeechInfo()),  # a chat model that speaks: realtime answers in audio
    )
    return server_factory(new_engine(pipeline), api_key=KEY)


WORDS = 2000  # an answer far longer than the test lets it run


@pytest.mark.parametrize("trigger", ["response.cancel", "speech"])
async def test_a_barge_in_stops_every_stage_within_one_step(counted, trigger):
    """After the first abort reaches a stage, no stage takes more than one more step for the response (the one
    it was already taking); counted in the stages' own steps, not in time."""
    LOG.clear()
    rate = 16000
    async with openai_client(counted.url, KEY).realtime.connect() as conn:
        session = vad_session(rate) if trigger == "speech" else {"type": "realtime"}
        await conn.session.update(session={**session, "max_output_tokens": WORDS})  # (the word stage's default: 64)
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(item=user_text(" ".join(["la"] * (WORDS - 1))))
        await conn.response.create()

        async def interrupt_after_five_words(ev, reply):
            if ev.type == "response.output_audio_transcript.delta" and len(reply.text.split()) == 4:
                if trigger == "speech":
                    asyncio.create_task(stream_audio(conn, np.concatenate([voiced(1.0, rate), quiet(0.6, rate)]), rate))
                else:
                    await conn.response.cancel()

        reply = await read_reply(conn, interrupt_after_five_words)
        assert reply.status == "cancelled"
        assert reply.done.response.status_details.reason == (
            "turn_detected" if trigger == "speech" else "client_cancelled"
        )
        if trigger == "speech":  # the turn that barged in is answered next
            assert (await read_reply(conn)).status == "completed"
        assert await wait_idle(counted) == {0: (0, 0), 1: (0, 0)}
    rid = reply.done.response.id  # the request id in every stage
    log = [(kind, sid) for kind, sid, r in LOG if r == rid]
    first_abort = log.index(next(e for e in log if e[0] == "abort"))
    assert {sid for kind, sid in log if kind == "abort"} == {0, 1}  # every stage was told
    for sid in (0, 1):
        after = log[first_abort:].count(("step", sid))
        assert after <= 1, f"stage {sid} took {after} steps after the abort"
    # both were at work (five words out; the tone stage turns what has streamed to it into audio, a chunk a
    # step), and were stopped long before the end
    assert 5 <= log.count(("step", 0)) < WORDS and 1 <= log.count(("step", 1)) < WORDS
