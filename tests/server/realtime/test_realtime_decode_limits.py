"""/v1/realtime audio goes through the shared decode-limits module: an ``input_audio_buffer.append`` (or an
input_audio item) larger than the buffer's room or the server's ``--max-media-bytes`` is refused from the base64
text's length, before any of it is decoded (a payload of invalid base64 over a limit is refused for its size,
not for its characters); audio within the limits is taken."""

from __future__ import annotations

import json

import pytest
import websockets

from omnistage.media.audio_decode import base64_size
from tests.server.conftest import new_engine
from tests.server.pipelines import omni_pipeline
from tests.server.realtime.helpers import BUFFER_S, KEY
from tests.server.realtime_client import b64, ws_url

MEDIA_BYTES = 4000  # this module's server: --max-media-bytes, far below its event and buffer limits
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def small(server_factory):
    return server_factory(new_engine(omni_pipeline()), api_key=KEY, max_media_bytes=MEDIA_BYTES)


async def _error(ws, event: dict) -> dict:
    await ws.send(json.dumps(event))
    ev = json.loads(await ws.recv())
    assert ev["type"] == "error", ev
    return ev["error"]


@pytest.mark.parametrize("text", ["AAAA", "AAA=", "AA==", "A" * 400, b64(bytes(range(256)) * 3)])
def test_base64_size_is_the_decoded_length(text):
    import base64

    assert base64_size(text) == len(base64.b64decode(text))


async def test_an_append_over_the_media_limit_is_refused_before_decoding(small):
    async with websockets.connect(ws_url(small.url), additional_headers=HEADERS, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        over = MEDIA_BYTES + 2
        for audio in (b64(bytes(over)), "@" * (over * 4 // 3 + 4)):  # valid PCM16, and not even base64
            err = await _error(ws, {"type": "input_audio_buffer.append", "event_id": "big", "audio": audio})
            assert (err["code"], err["param"], err["event_id"]) == ("payload_too_large", "audio", "big"), err
            assert f"limit of {MEDIA_BYTES} bytes" in err["message"]
        item = {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": b64(bytes(over))}]}
        err = await _error(ws, {"type": "conversation.item.create", "event_id": "it", "item": item})
        assert (err["code"], err["param"]) == ("payload_too_large", "item.content[0].audio"), err
        # within the limit the same kind of append is taken: the buffer holds it and commits it
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(bytes(MEDIA_BYTES))}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        kinds = [json.loads(await ws.recv())["type"] for _ in range(3)]
        assert kinds == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"], kinds
        err = await _error(ws, {"type": "input_audio_buffer.append", "event_id": "odd", "audio": b64(b"\x01\x02\x03")})
        assert (err["code"], err["param"]) == ("invalid_value", "audio") and "16-bit" in err["message"]


async def test_an_append_over_the_buffers_room_is_refused_from_its_length(srv):
    room = int(BUFFER_S * 24000) * 2  # 192 000 bytes, 48 000 at a time (under the 64 KiB event limit)
    async with websockets.connect(ws_url(srv.url), additional_headers=HEADERS, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for _ in range(3):
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(bytes(room // 4))}))
        # 48 006 bytes do not fit in the 48 000 left; the characters are not base64 at all: refused for the size
        err = await _error(ws, {"type": "input_audio_buffer.append", "event_id": "full", "audio": "@" * 64008})
        assert (err["code"], err["param"], err["event_id"]) == ("input_audio_buffer_full", "audio", "full"), err
        err = await _error(ws, {"type": "input_audio_buffer.append", "event_id": "bad", "audio": "@" * 400})
        assert (err["code"], err["param"]) == ("invalid_value", "audio") and "base64" in err["message"], err
