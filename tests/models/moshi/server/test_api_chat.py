"""``/api/chat``, ``moshi.server``'s own protocol (omnistage/server/realtime/duplex_moshi.py), on the tiny Moshi.

Two clients: one written here from the protocol (kind byte + payload, Ogg/Opus pages through the authors' ``sphn``),
and the authors' own ``moshi.client`` (0.2.13, unchanged, which ``make install`` puts in ``.venv/moshi-client``
without the package's dependencies; ``scripts/reference/moshi/run_client.py`` gives it a stand-in sound card). Greedy, a session over ``/api/chat`` writes the same text as the same input frames over
``/v1/realtime?duplex=1``, and its audio is that session's audio through Opus.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import sphn
import websockets

from omnistage.testing.requires import requirement
from tests.models.moshi.conftest import golden
from tests.models.moshi.server.conftest import KEY
from tests.models.moshi.server.test_duplex_ws import GREEDY, append_all, connect, events_until, send, url

FRAME = 1920
RATE = 24000
pytestmark = pytest.mark.slow
GREEDY_QUERY = "text_temperature=0&audio_temperature=0"  # the web UI's names for the two temperatures
REPO = Path(__file__).parents[4]


def opus_pages(pcm: np.ndarray) -> list[bytes]:
    """One Ogg/Opus page per 80 ms frame, as ``moshi.client`` writes its microphone."""
    writer = sphn.OpusStreamWriter(RATE)
    return [writer.append_pcm(pcm[at : at + FRAME]) for at in range(0, len(pcm), FRAME)]


def opus_decode(pages: list[bytes]) -> np.ndarray:
    reader = sphn.OpusStreamReader(RATE)
    return np.concatenate([reader.append_bytes(p) for p in pages])


def conversation_input() -> np.ndarray:
    """Golden case a's 20 frames, then one of silence: its output (the 21st frame in, the 20th out) tells a client
    that everything the 20th input frame produced, its text too, has come."""
    return np.concatenate([golden("a")["user_pcm"], np.zeros(FRAME, np.float32)])


async def chat(srv, pages: list[bytes], *, before: list[bytes] = (), frames: int | None = None) -> tuple[list, list]:
    """Talk over /api/chat: the audio pages (after the raw messages ``before``); the audio pages that came back
    (``frames`` of them: by default one per input frame after the first) and [(frame, kind, payload)] of every
    other message, ``frame`` the number of audio pages before it."""
    frames = len(pages) - 1 if frames is None else frames
    headers = {"Authorization": f"Bearer {KEY}"}
    async with websockets.connect(url(srv, f"/api/chat?{GREEDY_QUERY}"), additional_headers=headers) as ws:
        assert await asyncio.wait_for(ws.recv(), 60) == b"\x00"  # the handshake: the session holds its slot
        for message in before:
            await ws.send(message)
        for page in pages:
            await ws.send(b"\x01" + page)
        audio, other = [], []
        while len(audio) < frames:
            message = await asyncio.wait_for(ws.recv(), 120)
            if message[:1] == b"\x01":
                audio.append(message[1:])
            else:
                other.append((len(audio), message[0], message[1:].decode()))
    return audio, other


async def duplex(srv, pcm: np.ndarray) -> list[dict]:
    events: list[dict] = []
    async with await connect(srv) as ws:
        await send(ws, "session.update", session=GREEDY)
        await events_until(ws, "session.created", events)
        await append_all(ws, pcm, 4 * FRAME)
        await send(ws, "session.close")
        await events_until(ws, "session.closed", events)
    return events


def duplex_output(events: list[dict]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """The duplex session's audio (float, from PCM16) and [(frame, text)] as /api/chat numbers them."""
    frames, texts = [], []
    for e in events:
        if e["type"] == "response.output_audio.delta":
            frames.append(np.frombuffer(base64.b64decode(e["delta"]), "<i2").astype(np.float32) / 32768)
        elif e["type"] == "response.output_audio_transcript.delta":
            texts.append((len(frames), e["delta"]))
    return np.concatenate(frames), texts


async def offline(engine, pcm: np.ndarray) -> np.ndarray:
    """The session's float audio, from the served engine itself (``open_duplex``: no socket, no PCM16)."""
    session = await engine.open_duplex(GREEDY)
    await session.send(pcm)
    await session.close()
    frames = []
    while (frame := await session.recv(timeout=120)) is not None:
        frames.append(frame)
    return np.concatenate([f["audio"] for f in frames if "audio" in f])


@pytest.fixture(scope="module")
def greedy_chat(duplex_server):
    """One /api/chat conversation, with a message of every bad kind before the audio; the same input frames (the
    server's Opus decode of them: the same library, so the same samples) over /v1/realtime?duplex=1, and offline."""
    pcm = conversation_input()
    pages = opus_pages(pcm)
    bad = [b"", b"\x09abc", b"\x01not an ogg page", b"\x02text is the server's to send"]
    audio, other = asyncio.run(chat(duplex_server, pages, before=bad))
    events = asyncio.run(duplex(duplex_server, opus_decode(pages)))
    floats = duplex_server.run(offline(duplex_server.engine, opus_decode(pages)), 300)
    return pcm, audio, other, events, floats


def test_chat_equals_the_same_frames_over_the_duplex_socket(greedy_chat):
    pcm, audio, other, events, floats = greedy_chat
    frames = len(pcm) // FRAME - 1
    texts = [(f, payload) for f, kind, payload in other if kind == 2]
    dup_audio, dup_texts = duplex_output(events)
    assert len(audio) == frames and len(dup_audio) == frames * FRAME
    # the text of every frame up to the last one (whose text may follow its audio, after the client stopped)
    assert texts == [t for t in dup_texts if t[0] < frames] and len(texts) > 5
    # The audio is compared where it is exact. Opus is no tolerance to compare through: on the random tiny model's
    # noise-like output its round trip moves samples by up to 1.34 (peaks ~1.1), and rounding its input to 16 bits
    # already changes the decoded samples by up to 0.57 (measured), as the encoder's choices change. So: the
    # session's float frames, taken from the engine without a socket, are what the duplex socket sent in PCM16
    # (one 16-bit step; PCM16 holds [-1, 1), where the peaks clip), and /api/chat's pages are exactly the
    # authors' Opus encoder's pages of them.
    np.testing.assert_allclose(dup_audio, np.clip(floats, -1, 32767 / 32768), atol=1 / 32768, rtol=0)
    assert audio == opus_pages(floats)


def test_bad_messages_are_errors_and_the_conversation_goes_on(greedy_chat, duplex_server):
    other = greedy_chat[2]
    errors = [payload for _, kind, payload in other if kind == 5]
    assert errors[0] == "empty message"
    assert errors[1].startswith("unknown message kind 9")
    assert errors[2].startswith("audio: expected an Ogg page")
    assert errors[3].startswith("unknown message kind 2")
    pages = opus_pages(conversation_input()[: 6 * FRAME])
    garbled = pages[1][:4] + b"\xff" * 40  # an Ogg page's capture pattern, then garbage: refused at once
    short = pages[1][:27] + b"\xff" * 40  # a page header promising more bytes than come: found at the next page
    sent = [pages[0], garbled, pages[1], pages[2], short, *pages[3:]]
    audio, other = asyncio.run(chat(duplex_server, sent, frames=5))  # every good page is still a frame
    errors = [payload for _, kind, payload in other if kind == 5]
    assert len(errors) == 2 and all(e.startswith("audio: not Ogg/Opus") for e in errors), errors
    stage = duplex_server.engine.replicas(0)[0]
    deadline = time.monotonic() + 60  # stops a hang
    while stage.slots_held() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stage.slots_held() == 0  # the client closed the socket: the session ended and gave its slot back


def test_query_fields_and_the_api_key(duplex_server):
    async def status(path: str, headers: dict) -> tuple[int, dict]:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url(duplex_server, path), additional_headers=headers)
        return refused.value.response.status_code, json.loads(refused.value.response.body)["error"]

    bearer = {"Authorization": f"Bearer {KEY}"}
    basic = {"Authorization": "Basic " + base64.b64encode(f"moshi:{KEY}".encode()).decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(b"moshi:wrong").decode()}

    async def run():
        results = [await status("/api/chat", {}), await status("/api/chat", wrong)]
        for query in ("text_topk=many", "audio_temperature=-1", "pad_mult=1.5", "voice_prompt=x.pt&text_prompt=Hi"):
            results.append(await status(f"/api/chat?{query}", bearer))
        async with websockets.connect(url(duplex_server, "/api/chat?pad_mult=0"), additional_headers=basic) as ws:
            results.append(await asyncio.wait_for(ws.recv(), 60))
        persona = "/api/chat?voice_prompt=tiny.pt&text_prompt=You%20are%20a%20teacher."  # PersonaPlex's UI's fields
        async with websockets.connect(url(duplex_server, persona), additional_headers=bearer) as ws:
            results.append(await asyncio.wait_for(ws.recv(), 60))
        return results

    no_key, wrong_key, topk, temperature, pad, voice, handshake, persona_handshake = asyncio.run(run())
    assert no_key[0] == wrong_key[0] == 401 and no_key[1]["code"] == "invalid_api_key"
    assert topk[0] == 400 and topk[1]["param"] == "text_topk"
    assert temperature[0] == 400 and temperature[1]["param"] == "audio_temperature"
    assert pad[0] == 400 and pad[1]["param"] == "pad_mult"
    assert voice[0] == 400 and voice[1]["param"] == "voice_prompt"
    assert persona_handshake == b"\x00"
    assert handshake == b"\x00"  # the key as Basic auth's password: what `moshi.client --url ws://moshi:KEY@...` sends


CLIENT = REPO / ".venv" / "moshi-client"  # moshi 0.2.13 without its dependencies (make install puts it there)


@requirement(None if (CLIENT / "moshi" / "client.py").exists() else f"needs {CLIENT} (make install)")
def test_the_authors_client_talks_to_omnistage(greedy_chat, duplex_server, tmp_path):
    """``moshi.client`` 0.2.13 itself, unchanged (its folder on the path; its imports are aiohttp, numpy and sphn,
    which the project has), run by scripts/reference/moshi/run_client.py with a stand-in sound card."""
    pcm, audio, other = greedy_chat[:3]
    np.save(tmp_path / "in.npy", pcm)
    host = duplex_server.url.split("://", 1)[1]
    # moshi.client appends "/api/chat" to --url: the query's last field takes that, and is ignored by the server
    client_url = f"ws://moshi:{KEY}@{host}/api/chat?{GREEDY_QUERY}&x="
    script = REPO / "scripts" / "reference" / "moshi" / "run_client.py"
    run = subprocess.run(
        [sys.executable, str(script), client_url, str(tmp_path / "in.npy"), str(tmp_path / "out.npz"), "240"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(CLIENT)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    frames = len(pcm) // FRAME - 1
    texts = [(f, t) for f, t in zip(out["text_frame"].tolist(), out["text"].tolist(), strict=True) if f < frames]
    assert texts == [(f, payload) for f, kind, payload in other if kind == 2]
    # the same server output through the same Opus decoder: the same samples
    np.testing.assert_array_equal(out["pcm"][: frames * FRAME], opus_decode(audio))
