"""Moshi duplex sessions offline (``AsyncOmni.open_duplex``) against the authors' step loop (goldens: conftest).

One engine for the module. Each session is fed its case's user audio in uneven pieces (the engine cuts frames);
greedy output frames (text token + 8 codes) equal the reference's exactly and the decoded audio within
``PCM_ATOL``; four sessions at once, started and fed out of step, each equal the same session alone.
"""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from tests.models.moshi.conftest import (
    CASES,
    GREEDY,
    PCM_ATOL,
    PERSONA,
    PERSONA_PARAMS,
    SAMPLED_PARAMS,
    TINY,
    golden,
)

FRAME = 1920
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(moshi_dir):
    torch.set_num_threads(1)
    loop = asyncio.new_event_loop()
    omni = AsyncOmni(model=str(moshi_dir))
    loop.run_until_complete(omni.start())
    yield loop, omni
    loop.run_until_complete(omni.shutdown())
    loop.close()


async def run_session(omni, pcm: np.ndarray, pieces: list[int], delay: float = 0.0, params=GREEDY) -> list[dict]:
    """Feed ``pcm`` in pieces of the given sizes (cycled), then close; every frame that came out."""
    session = await omni.open_duplex(params)
    frames: list[dict] = []

    async def receive() -> None:
        while (frame := await session.recv(timeout=120)) is not None:
            frames.append(frame)

    reader = asyncio.create_task(receive())
    at, i = 0, 0
    while at < len(pcm):
        n = pieces[i % len(pieces)]
        await session.send(pcm[at : at + n])
        at, i = at + n, i + 1
        await asyncio.sleep(delay)
    await session.close()
    await asyncio.wait_for(reader, 120)
    assert session.finish_reason == "stop"
    return frames


def check(frames: list[dict], case: dict) -> None:
    users = np.array([f["user_codes"] for f in frames])
    np.testing.assert_array_equal(users, case["user_codes"])  # Mimi's encoder, frame by frame
    out = [f for f in frames if "audio" in f]
    tokens = np.array([f["text_token_ids"] + f["audio_codes"] for f in out])
    np.testing.assert_array_equal(tokens, case["tokens"])
    pcm = np.concatenate([f["audio"] for f in out])
    np.testing.assert_allclose(pcm, case["pcm"], atol=PCM_ATOL, rtol=0)
    assert "".join(f["text"] for f in out) == str(case["text"])  # the transcript moshi.server sends


def test_greedy_session_equals_reference(engine):
    loop, omni = engine
    case = golden("a")
    frames = loop.run_until_complete(run_session(omni, case["user_pcm"], [FRAME * 3 + 100, 700, FRAME - 800]))
    check(frames, case)


def test_four_sessions_at_once_each_equal_alone(engine):
    loop, omni = engine
    cases = {name: golden(name) for name in CASES}

    async def all_four():
        pieces = {"a": [FRAME], "b": [5000, 333], "c": [FRAME * 2], "d": [FRAME // 2]}
        delays = {"a": 0.0, "b": 0.01, "c": 0.0, "d": 0.005}
        runs = [run_session(omni, cases[n]["user_pcm"], pieces[n], delays[n]) for n in CASES]
        return dict(zip(CASES, await asyncio.gather(*runs)))

    frames = loop.run_until_complete(all_four())
    for name in CASES:
        check(frames[name], cases[name])
    stage = omni.replicas(0)[0]
    assert max(stage.batch_sizes) > 1  # the sessions shared steps
    assert stage.slots_held() == 0  # every session's slot came back


def test_seeded_sampling_equals_reference_beside_another_session(engine):
    """The reference sampled from torch's global generator seeded alike; here the session's own generator draws
    the same numbers in the same order (text token, then the 8 codes), whatever else shares its steps."""
    loop, omni = engine
    sampled, other = golden("s"), golden("a")

    async def both():
        return await asyncio.gather(
            run_session(omni, sampled["user_pcm"], [FRAME], params=SAMPLED_PARAMS),
            run_session(omni, other["user_pcm"], [FRAME * 2]),
        )

    frames, other_frames = loop.run_until_complete(both())
    check(frames, sampled)
    check(other_frames, other)


def test_bad_audio_is_refused_by_name_and_the_session_goes_on(engine):
    loop, omni = engine
    case = golden("c")

    async def run():
        session = await omni.open_duplex(GREEDY)
        with pytest.raises(InvalidRequestError) as bad:
            await session.send(np.zeros((2, 100), np.float32))
        assert bad.value.field == "pcm"
        await session.send(case["user_pcm"])
        await session.close()
        frames = []
        while (frame := await session.recv(timeout=120)) is not None:
            frames.append(frame)
        return frames

    check(loop.run_until_complete(run()), case)


def test_persona_session_equals_personaplex_beside_a_plain_one(engine):
    """PersonaPlex's prompt (a voice preset, then the instructions) is stepped before the first frame, in the
    same batches as a plain session: the persona's frames equal PersonaPlex's step loop, the plain one's still
    equal the authors' ``LMGen``."""
    loop, omni = engine
    case, plain = golden("persona"), golden("a")
    for name, key in (("model.safetensors", "model_sha256"), ("voices/tiny.pt", "voice_sha256")):
        assert hashlib.sha256((TINY / name).read_bytes()).hexdigest() == PERSONA[key]  # what the reference ran

    async def both():
        return await asyncio.gather(
            run_session(omni, plain["user_pcm"], [FRAME], params=dict(GREEDY, **PERSONA_PARAMS)),
            run_session(omni, plain["user_pcm"], [FRAME * 2]),
        )

    frames, plain_frames = loop.run_until_complete(both())
    check(plain_frames, plain)
    tokens = np.array([f["text_token_ids"] + f["audio_codes"] for f in frames])
    # PersonaPlex steps the model on a frame once the next one arrives: its first output is the prompt's last
    # (forced silence), and its last frame is never stepped. Here that frame is stepped too: one output more.
    assert len(tokens) == len(case["tokens"]) + 1
    np.testing.assert_array_equal(tokens[:-1], case["tokens"])
    np.testing.assert_array_equal([f["user_codes"] for f in frames[1:]], case["user_codes"])
    assert all(np.isfinite(f["audio"]).all() and f["audio"].shape == (FRAME,) for f in frames)


def test_bad_params_are_refused_by_name(engine):
    loop, omni = engine

    empty = loop.run_until_complete(omni.open_duplex(dict(GREEDY, voice="", instructions="")))  # asks for nothing
    loop.run_until_complete(empty.abort())
    for params, name in (
        ({"temperature": -1}, "temperature"),
        ({"top_k": "many"}, "top_k"),
        ({"seed": -3}, "seed"),
        ({"voice": "nobody", "instructions": "Hi."}, "voice"),
        ({"voice": "../tiny/voices/tiny", "instructions": "Hi."}, "voice"),
        ({"instructions": "Hi."}, "voice"),
        ({"voice": "tiny"}, "instructions"),
        ({"voice": "tiny", "instructions": "word " * 800}, "instructions"),
    ):
        with pytest.raises(InvalidRequestError) as bad:
            loop.run_until_complete(omni.open_duplex(dict(GREEDY, **params)))
        assert bad.value.field == name
