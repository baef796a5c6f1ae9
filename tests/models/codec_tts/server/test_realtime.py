"""/v1/realtime with a speech model (tiny codec_tts, the package's ``omnistage serve`` subprocess): it speaks a
text turn as /v1/audio/speech speaks the same text with the same voice and knobs (greedy: within one 16-bit step).
(A text chat model over realtime: tests/e2e/test_families.py.)"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.server.realtime_client import next_event, openai_client, read_reply

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

FRAMES = 40  # K=2 tokens per frame, 320 samples per frame at 16 kHz
KEY = "sk-any"  # the server asks for none; the client sends one


async def test_a_text_turn_is_spoken_as_the_speech_route_speaks_it(tts_server):
    async with openai_client(tts_server, KEY).realtime.connect(model="tiny-tts") as conn:
        created = await next_event(conn, "session.created")
        assert created.session.output_modalities == ["audio"]
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]}, event_id="txt")
        err = (await next_event(conn, "error")).error
        assert (err.param, err.event_id) == ("session.output_modalities", "txt")  # it only speaks
        await conn.session.update(
            session={
                "type": "realtime",
                "max_output_tokens": 2 * FRAMES,
                "audio": {"output": {"voice": "bass"}},
                "extra_body": {"temperature": 0, "min_tokens": 2 * FRAMES},
            }
        )
        await next_event(conn, "session.updated")
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello world"}]}
        )
        await conn.response.create()
        reply = await read_reply(conn)
    with httpx.Client(base_url=tts_server, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as client:
        with client.stream(
            "POST",
            "/v1/audio/speech",
            json={
                "model": "tiny-tts",
                "input": "hello world",
                "voice": "bass",
                "response_format": "pcm",
                "stream": True,
                "temperature": 0,
                "max_tokens": 2 * FRAMES,
                "min_tokens": 2 * FRAMES,
            },
        ) as r:
            assert r.status_code == 200
            theirs = np.frombuffer(b"".join(r.iter_raw()), "<i2").astype(int)
    ours = np.frombuffer(reply.pcm, "<i2").astype(int)
    assert reply.status == "completed" and not reply.errors
    assert reply.text == "hello world" == reply.transcript_done  # what it spoke
    assert ours.shape == theirs.shape == (FRAMES * 320,)
    assert np.abs(ours - theirs).max() <= 1
