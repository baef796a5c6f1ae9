"""Qwen2.5-Omni in-process: text, audio, image, video and video-with-its-audio prompts through vLLM's own thinker,
the talker conditioned on the thinker's hidden states of prompt + reply (handed out by the thinker's own engine:
models/qwen2_5_omni/vllm_speaking.py + stages/llm/hidden_connector.py),
token2wav's DiT + BigVGAN — against transformers' ``Qwen2_5OmniForConditionalGeneration.generate(**processor
inputs, return_audio=True)`` with greedy thinker and talker and the same seed: text equal, waveform within 1e-4."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.testing.streams import all_outputs, finished_by_stage
from tests.models import omni_media as media
from tests.models.qwen2_5_omni.conftest import SEED

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

THINK, TALK = 10, 16
GREEDY = [{"temperature": 0, "max_tokens": THINK}, {"temperature": 0, "max_tokens": TALK}, {"seed": SEED}]
TOL = 1e-4

CLIP, IMAGE, FRAMES = media.clip(1.0, 0), media.image(0), media.frames(4, 0)


def text(t):
    return {"type": "text", "text": t}


# omnistage's message parts, the processor template's parts, the processor's media
CHATS = {
    "text": ([text("hello, who are you?")], [text("hello, who are you?")], {}),
    "audio": (
        [
            {"type": "input_audio", "input_audio": {"data": media.wav_base64(CLIP), "format": "wav"}},
            text("what did i just say?"),
        ],
        [{"type": "audio", "audio": "x"}, text("what did i just say?")],
        {"audio": [CLIP]},
    ),
    "image": (
        [{"type": "image_url", "image_url": {"url": media.png_url(IMAGE)}}, text("describe the picture")],
        [{"type": "image", "image": "x"}, text("describe the picture")],
        {"images": [IMAGE]},
    ),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(omni25_dir):
    engine = AsyncOmni(str(omni25_dir), max_model_len=1024)
    await engine.start()
    yield engine
    await engine.shutdown()


async def run(omni, prompt, params=GREEDY, **kw):
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=params, **kw))
    return finished_by_stage(outs)


def assert_equal(finals, ref):
    assert finals[0].token_ids == ref.reply
    audio = torch.from_numpy(finals[2].audio)
    assert audio.shape == ref.audio.shape and ref.audio.abs().max() > 0.01  # real signal
    assert (audio - ref.audio).abs().max().item() <= TOL


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", list(CHATS))
async def test_chat_speaks_as_transformers(omni, reference, name):
    parts, turn, mm = CHATS[name]
    ref = reference.run([{"role": "user", "content": turn}], THINK, TALK, mm=mm)
    finals = await run(omni, {"messages": [{"role": "user", "content": parts}]})
    assert_equal(finals, ref)


@pytest.mark.asyncio(loop_scope="module")
# with its audio: vLLM's own get_mrope_input_positions places the block one token off (vllm_thinker.py)
@pytest.mark.parametrize("use_audio_in_video", [False, True])
async def test_video_and_video_with_its_audio_offline(omni, reference, use_audio_in_video):
    turn = [{"type": "video", "video": "x"}, text("what happens?")]
    mm = {"videos": [FRAMES], **({"audio": [CLIP]} if use_audio_in_video else {})}
    ref = reference.run([{"role": "user", "content": turn}], THINK, TALK, mm=mm, use_audio_in_video=use_audio_in_video)
    data = {"video": FRAMES, **({"audio": (CLIP, media.RATE)} if use_audio_in_video else {})}
    finals = await run(
        omni,
        {
            "prompt": reference.template([{"role": "user", "content": turn}]),
            "multi_modal_data": data,
            "mm_processor_kwargs": {"use_audio_in_video": use_audio_in_video},
        },
    )
    assert_equal(finals, ref)


@pytest.mark.asyncio(loop_scope="module")
async def test_four_concurrent_requests_equal_their_solo_runs(omni):
    prompts = [{"messages": [{"role": "user", "content": CHATS[name][0]}]} for name in ("text", "audio", "image")]
    prompts.append({"messages": [{"role": "user", "content": "what is the weather"}]})
    talker = omni.replicas(1)[0]
    before = len(talker.batch_sizes)
    together = await asyncio.gather(*(run(omni, p) for p in prompts))
    assert max(list(talker.batch_sizes)[before:]) >= 2  # they shared talker steps
    for prompt, got in zip(prompts, together):
        solo = await run(omni, prompt)
        assert got[0].token_ids == solo[0].token_ids
        assert got[2].audio.shape == solo[2].audio.shape and np.abs(got[2].audio - solo[2].audio).max() <= TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_the_talker_speaks_while_the_thinker_still_generates(omni):
    """Async chunk (the default): the talker prefills with the thinker's second token and steps as the thinker's
    hidden states arrive (its speech equals transformers': the tests above run this way), so a long reply has talker
    steps behind it before the thinker's last token."""
    talker = omni.replicas(1)[0]
    before, steps_at_thinker_end = len(talker.batch_sizes), None
    params = [
        {"temperature": 0, "max_tokens": 48, "ignore_eos": True},
        {"temperature": 0, "max_tokens": TALK},
        {"seed": SEED},
    ]
    async for out in omni.generate({"messages": [{"role": "user", "content": "hello"}]}, sampling_params_list=params):
        if out.stage_id == 0 and out.finished:
            steps_at_thinker_end = len(talker.batch_sizes) - before
    assert steps_at_thinker_end is not None and steps_at_thinker_end > 0


@pytest.mark.asyncio(loop_scope="module")
async def test_abort_while_the_talker_waits_for_the_thinker_frees_every_stage(omni):
    """Aborted mid-reply (the talker already streaming from it): no stage keeps the request, its hidden-state file
    is removed, and the stages keep serving."""
    params = [{"temperature": 0, "max_tokens": 64, "ignore_eos": True}, {"temperature": 0, "max_tokens": TALK}]
    thinker, talker = omni.replicas(0)[0], omni.replicas(1)[0]
    before, aborted_at = len(talker.prefill_sizes), None
    async for out in omni.generate(
        {"messages": [{"role": "user", "content": "hello"}]}, request_id="abort-me", sampling_params_list=params
    ):
        if out.stage_id == 0 and len(talker.prefill_sizes) > before:  # the talker has prefilled from the stream
            aborted_at = out.finished
            await omni.abort("abort-me")
            break
    assert aborted_at is False  # mid-reply
    for _ in range(100):
        if not omni.running_requests() and not os.listdir(thinker.rows_dir):
            break
        await asyncio.sleep(0.05)
    assert omni.running_requests() == [] and os.listdir(thinker.rows_dir) == []
    finals = await run(omni, {"messages": [{"role": "user", "content": "hi there"}]})  # the stages keep serving
    assert finals[2].audio is not None


@pytest.mark.asyncio(loop_scope="module")
async def test_voices_and_text_out_asks_no_hidden_states(omni, reference):
    prompt = {"messages": [{"role": "user", "content": "hello, who are you?"}]}
    thinker = omni.replicas(0)[0]
    before = thinker.rows_read
    ethan = reference.run([{"role": "user", "content": "hello, who are you?"}], THINK, TALK, speaker="Ethan")
    finals = await run(omni, {**prompt, "speech": {"voice": "ethan"}})
    assert_equal(finals, ethan)
    assert thinker.rows_read == before + 1  # the talker's conditioning, from the thinker's own engine
    text_only = await run(omni, prompt, output_modalities=["text"])
    assert set(text_only) == {0} and thinker.rows_read == before + 1  # none for text out
    assert thinker.engine.vllm_config.kv_transfer_config.kv_connector == "HiddenRowsConnector"
    assert os.listdir(thinker.rows_dir) == []  # every file read was removed


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "params, field",
    [
        ([None, {"temprature": 0.1}, None], "temprature"),  # (min_p, a vLLM field it does not read: dropped)
        ([None, {"speaker": "Bob"}, None], "speaker"),
        ([None, {"max_tokens": 4}, {"num_steps": 0}], "num_steps"),  # token2wav's (checked when it runs)
        ([None, {"max_tokens": 4}, {"cfg": 1}], "sampling_params_list[2]"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(omni, params, field):
    with pytest.raises(InvalidRequestError) as e:
        await run(omni, {"messages": [{"role": "user", "content": "hi there"}]}, params=params)
    assert e.value.field == field
    assert omni.running_requests() == []
