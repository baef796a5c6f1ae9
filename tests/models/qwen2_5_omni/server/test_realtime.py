"""/v1/realtime with tiny Qwen2.5-Omni (``omnistage serve`` subprocess): an audio turn answers in text and speech as
/v1/chat/completions answers the same conversation (itself tested against transformers in
test_http.py, on the same server)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models import omni_media as media
from tests.server.realtime_client import b64, chat_stream, next_event, openai_client, pcm16_bytes, read_reply

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

KEY = "sk-any"  # the server asks for none; the client sends one
THINK, TALK = 10, 16
EXTRA = {"temperature": 0, "seed": 0, "sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}]}


async def test_an_audio_turn_equals_chat_completions(server):
    clip = media.clip(1.0, 0)
    async with openai_client(server, KEY).realtime.connect(model="tiny-omni25") as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "max_output_tokens": THINK,
                "extra_body": EXTRA,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": media.RATE}}},
            }
        )
        updated = await next_event(conn, "session.updated")
        assert updated.session.audio.output.format.rate == 24000
        pcm = pcm16_bytes(clip)
        for i in range(0, len(pcm), 3200):
            await conn.input_audio_buffer.append(audio=b64(pcm[i : i + 3200]))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        reply = await read_reply(conn)
    parts = [{"type": "input_audio", "input_audio": {"data": media.wav_base64(clip), "format": "wav"}}]
    text, theirs = chat_stream(
        server, KEY, [{"role": "user", "content": parts}], modalities=["text", "audio"], max_tokens=THINK, **EXTRA
    )
    ours, theirs_arr = np.frombuffer(reply.pcm, "<i2").astype(int), np.frombuffer(theirs, "<i2").astype(int)
    # cut at max_output_tokens: incomplete, as OpenAI's Realtime API says (with or without speech after it)
    cut = reply.done.response.usage.output_tokens >= THINK
    assert reply.status == ("incomplete" if cut else "completed") and not reply.errors and reply.text == text and text
    assert ours.size > 0 and ours.shape == theirs_arr.shape and np.abs(ours - theirs_arr).max() <= 1
