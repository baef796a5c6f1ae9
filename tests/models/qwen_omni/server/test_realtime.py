"""/v1/realtime against a real server (``omnistage serve`` subprocess): tiny Qwen3-Omni hears PCM16 appended in
chunks and answers in text + speech exactly as /v1/chat/completions answers the same conversation (itself
tested against transformers in test_http.py, on the same server); a second turn carries the first; server VAD commits
the spoken turn and answers it; a cancel aborts every stage; eight concurrent sessions each equal their solo
run. (A speech model: tests/models/codec_tts/server/test_realtime.py; a text chat model: tests/e2e/test_families.py.)"""

from __future__ import annotations

import asyncio
import io
import time

import httpx
import numpy as np
import pytest
import soundfile

from tests.models import omni_media as media
from tests.server.realtime_client import (
    b64,
    chat_stream,
    chat_usage,
    next_event,
    openai_client,
    pcm16_bytes,
    quiet,
    read_reply,
    voiced,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KEY = "sk-any"  # the server asks for none; the client sends one
THINK, TALK = 12, 20
EXTRA = {"temperature": 0, "sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}]}
SESSION = {
    "type": "realtime",
    "max_output_tokens": THINK,
    "extra_body": EXTRA,
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": media.RATE}, "turn_detection": None}},
}
CHAT = {"modalities": ["text", "audio"], "max_tokens": THINK, **EXTRA}
CLIP = media.clip(1.0, 0)


def ended(reply, limit: int = THINK) -> bool:
    """Finished without error: ``incomplete`` (reason ``max_output_tokens``) when the thinker's reply was cut at the
    limit, as OpenAI's Realtime API says, with or without speech after it; ``completed`` otherwise."""
    cut = reply.done.response.usage.output_tokens >= limit
    return reply.status == ("incomplete" if cut else "completed") and not reply.errors


def audio_part(wav_b64: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": wav_b64, "format": "wav"}}


def assert_same_speech(ours: bytes, theirs: bytes) -> None:
    a, b = np.frombuffer(ours, "<i2").astype(int), np.frombuffer(theirs, "<i2").astype(int)
    assert a.size > 0 and a.shape == b.shape
    assert np.abs(a - b).max() <= 1  # one 16-bit step


def assert_chat_usage(usage, chat: dict) -> None:
    """A ``response.done`` usage (as the openai client parses it) counts what the chat route counts for the same
    turn, under the Realtime API's names; ``cached_tokens`` is only bounded: it counts what earlier requests left
    in vLLM's prefix cache, so it depends on the order of the requests."""
    ours = usage.model_dump(exclude_none=True)
    cached = ours["input_token_details"].pop("cached_tokens")
    assert 0 <= cached <= usage.input_tokens
    prompt, reply = chat["prompt_tokens_details"], chat["completion_tokens_details"]
    assert ours == {
        "input_tokens": chat["prompt_tokens"],
        "output_tokens": chat["completion_tokens"],
        "total_tokens": chat["total_tokens"],
        "input_token_details": {k: prompt[k] for k in ("text_tokens", "audio_tokens", "image_tokens")},
        "output_token_details": {k: reply[k] for k in ("text_tokens", "audio_tokens")},
    }
    assert prompt["audio_tokens"] > 0 and prompt["text_tokens"] > 0 and reply["audio_tokens"] > 0  # a real split


async def speak(conn, pcm: bytes, chunk: int = 3200) -> None:
    """Append ``pcm`` in ~0.1 s pieces, as a microphone would, then commit."""
    for i in range(0, len(pcm), chunk):
        await conn.input_audio_buffer.append(audio=b64(pcm[i : i + chunk]))
    await conn.input_audio_buffer.commit()
    committed = await next_event(conn, "input_audio_buffer.committed")
    added = await next_event(conn, "conversation.item.added")
    assert added.item.id == committed.item_id and added.item.content[0].type == "input_audio"


async def test_an_audio_turn_and_a_second_turn_equal_chat_completions(omni_server):
    async with openai_client(omni_server, KEY).realtime.connect(model="tiny-omni") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.audio.output.format.rate == 24000
        await conn.session.update(session=SESSION)
        assert (await next_event(conn, "session.updated")).session.audio.input.format.rate == media.RATE
        await speak(conn, pcm16_bytes(CLIP))
        await conn.response.create()
        first = await read_reply(conn)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say it again"}]}
        )
        await conn.response.create()
        second = await read_reply(conn)
    turn1 = [{"role": "user", "content": [audio_part(media.wav_base64(CLIP))]}]
    text, pcm = chat_stream(omni_server, KEY, turn1, **CHAT)
    assert ended(first)
    assert first.text == text and first.transcript_done == text and text
    assert_same_speech(first.pcm, pcm)
    assert first.types.index("response.output_audio.delta") < first.types.index("response.output_audio.done")
    usage = first.done.response.usage
    assert_chat_usage(usage, chat_usage(omni_server, KEY, turn1, **CHAT))
    both = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "say it again"}]
    text2, pcm2 = chat_stream(omni_server, KEY, both, **CHAT)
    assert ended(second) and second.text == text2
    assert_same_speech(second.pcm, pcm2)
    assert second.done.response.usage.input_tokens > usage.input_tokens  # the first turn is in the prompt


async def test_input_at_another_rate_is_resampled_once_with_soxr(omni_server):
    """24 kHz PCM (OpenAI's default input format) reaches the model as soxr's 16 kHz resampling of it."""
    import soxr

    rate = 24000
    t = np.arange(rate) / rate
    x = (np.round(0.3 * np.sin(2 * np.pi * 330 * t) * 32768) / 32768).astype(np.float32)
    async with openai_client(omni_server, KEY).realtime.connect(model="tiny-omni") as conn:
        await conn.session.update(
            session={**SESSION, "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}}}
        )
        await next_event(conn, "session.updated")
        await speak(conn, pcm16_bytes(x))
        await conn.response.create()
        reply = await read_reply(conn)
    buf = io.BytesIO()
    soundfile.write(
        buf,
        soxr.resample(x, rate, media.RATE, quality="HQ").astype(np.float32),
        media.RATE,
        format="WAV",
        subtype="FLOAT",
    )
    resampled = audio_part(b64(buf.getvalue()))
    text, pcm = chat_stream(omni_server, KEY, [{"role": "user", "content": [resampled]}], **CHAT)
    assert reply.text == text
    assert_same_speech(reply.pcm, pcm)


async def test_cancel_mid_response_stops_every_stage_and_the_session_goes_on(omni_server):
    long = {
        **SESSION,
        "max_output_tokens": 400,
        "extra_body": {
            "temperature": 0,
            "ignore_eos": True,
            "sampling_params_list": [None, {"temperature": 0, "max_tokens": 400}],
        },
    }
    async with openai_client(omni_server, KEY).realtime.connect(model="tiny-omni") as conn:
        await conn.session.update(session=long)
        await next_event(conn, "session.updated")
        await speak(conn, pcm16_bytes(CLIP))
        await conn.response.create()

        async def cancel_on_first_audio(ev, reply):
            if ev.type == "response.output_audio.delta" and not reply.pcm:
                await conn.response.cancel()

        reply = await read_reply(conn, cancel_on_first_audio)
        assert reply.status == "cancelled" and reply.done.response.status_details.reason == "client_cancelled"
        assert reply.done.response.output[0].content[0].transcript == reply.text
        deadline = time.monotonic() + 30
        while True:  # the abort reaches every stage (none keeps generating)
            stages = httpx.get(f"{omni_server}/health", timeout=10).json()["stages"]
            idle = all(s["running"] == 0 and s["queue_depth"] == 0 for s in stages.values())
            if idle or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert idle, stages
        await conn.session.update(session=SESSION)
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
        )
        await conn.response.create()
        after = await read_reply(conn)
    assert ended(after) and after.text and after.pcm


async def test_server_vad_commits_the_spoken_turn_and_the_answer_equals_chat_completions(omni_server):
    rate = media.RATE
    clip = np.concatenate([quiet(1.0, rate), voiced(1.5, rate), quiet(1.5, rate)])
    vad = {"type": "server_vad", "prefix_padding_ms": 300, "silence_duration_ms": 500}
    async with openai_client(omni_server, KEY).realtime.connect(model="tiny-omni") as conn:
        await conn.session.update(
            session={
                **SESSION,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}, "turn_detection": vad}},
            }
        )
        await next_event(conn, "session.updated")
        pcm = pcm16_bytes(clip)
        for i in range(0, len(pcm), 3200):  # 0.1 s at a time, as a microphone sends it
            await conn.input_audio_buffer.append(audio=b64(pcm[i : i + 3200]))
        started = await next_event(conn, "input_audio_buffer.speech_started")
        stopped = await next_event(conn, "input_audio_buffer.speech_stopped")
        reply = await read_reply(conn)  # create_response (the default): answered without response.create
    assert abs(started.audio_start_ms - 700) <= 90 and abs(stopped.audio_end_ms - 2500) <= 120
    turn = clip[started.audio_start_ms * rate // 1000 : stopped.audio_end_ms * rate // 1000]
    turn_part = audio_part(media.wav_base64(turn))
    text, theirs = chat_stream(omni_server, KEY, [{"role": "user", "content": [turn_part]}], **CHAT)
    assert ended(reply) and reply.text == text
    assert_same_speech(reply.pcm, theirs)


async def test_eight_concurrent_audio_sessions_each_equal_their_solo_run(omni_server):
    """Eight sessions, each its own clip, spoken at once: every answer (text and speech) is the one the same
    session gets alone — concurrent sessions share the engines' batches without mixing their turns."""

    async def talk(seed: int):
        async with openai_client(omni_server, KEY).realtime.connect(model="tiny-omni") as conn:
            await next_event(conn, "session.created")
            await conn.session.update(session=SESSION)
            await next_event(conn, "session.updated")
            await speak(conn, pcm16_bytes(media.clip(0.5, seed)))
            await conn.response.create()
            return await read_reply(conn)

    solo = [await talk(seed) for seed in range(8)]
    together = await asyncio.gather(*(talk(seed) for seed in range(8)))
    assert len({r.text for r in solo}) > 1  # the clips get different answers: a mix-up would show
    for reply, alone in zip(together, solo):
        assert ended(reply)
        assert reply.text == alone.text
        assert_same_speech(reply.pcm, alone.pcm)
