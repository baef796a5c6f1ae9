"""Qwen3-Omni hears and sees, in-process: audio, image, video and video-with-its-audio prompts through vLLM's own
thinker, the talker conditioned on the thinker's hidden states at the media positions (handed out by the thinker's own
engine: models/qwen_omni/vllm_speaking.py + stages/llm/hidden_connector.py), against transformers' ``Qwen3OmniMoeForConditionalGeneration.generate(**processor inputs,
return_audio=True)`` with greedy thinker and talker: text equal, waveform within 1e-4."""

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

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

THINK, TALK = 10, 16
GREEDY = [{"temperature": 0, "max_tokens": THINK}, {"temperature": 0, "max_tokens": TALK}]
TOL = 1e-4

CLIP, CLIP2, IMAGE, FRAMES = media.clip(1.0, 0), media.clip(0.6, 1), media.image(0), media.frames(4, 0)


def audio_part(x):
    return {"type": "input_audio", "input_audio": {"data": media.wav_base64(x), "format": "wav"}}


def image_part(img):
    return {"type": "image_url", "image_url": {"url": media.png_url(img)}}


def text(t):
    return {"type": "text", "text": t}


# (name, omnistage messages, the same conversation for the processor's template, processor media)
CHATS = {
    "audio": ([{"role": "user", "content": [audio_part(CLIP), text("what did i just say?")]}], {"audio": [CLIP]}),
    "image": ([{"role": "user", "content": [image_part(IMAGE), text("describe the picture")]}], {"images": [IMAGE]}),
    "audio+image": (
        [{"role": "user", "content": [image_part(IMAGE), audio_part(CLIP2), text("and the sound?")]}],
        {"images": [IMAGE], "audio": [CLIP2]},
    ),
    "multi-turn": (
        [
            {"role": "user", "content": [audio_part(CLIP), text("hello")]},
            {"role": "assistant", "content": "i am a voice assistant."},
            {"role": "user", "content": [image_part(IMAGE), text("who are you?")]},
        ],
        {"audio": [CLIP], "images": [IMAGE]},
    ),
}


def template_messages(messages):
    """The processor's chat template names parts by type (``audio`` / ``image``)."""
    kinds = {"input_audio": "audio", "image_url": "image"}
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [{"type": kinds[p["type"]], kinds[p["type"]]: "x"} if p["type"] in kinds else p for p in content]
        out.append({"role": m["role"], "content": content})
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(omni_dir):
    engine = AsyncOmni(str(omni_dir), max_model_len=1024)
    await engine.start()
    yield engine
    await engine.shutdown()


def reference_for(reference, messages, mm, **kw):
    prompt = reference.processor.apply_chat_template(
        template_messages(messages), add_generation_prompt=True, tokenize=False
    )
    inputs = reference.processor(text=prompt, return_tensors="pt", **mm, **kw)
    return prompt, reference.run_inputs(dict(inputs), THINK, TALK, **kw)


async def run(omni, prompt, **kw):
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=GREEDY, **kw))
    return outs, finished_by_stage(outs)


def assert_equal(finals, ref):
    assert finals[0].token_ids == ref.reply
    audio = torch.from_numpy(finals[2].audio)
    assert audio.shape == ref.audio.shape
    assert (audio - ref.audio).abs().max().item() <= TOL


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", list(CHATS))
async def test_media_chat_speaks_as_transformers(omni, reference, name):
    messages, mm = CHATS[name]
    _, ref = reference_for(reference, messages, mm)
    outs, finals = await run(omni, {"messages": messages})
    assert_equal(finals, ref)
    pieces = [
        np.asarray(o.delta["audio"]).reshape(-1)
        for o in outs
        if o.stage_id == 2 and not o.finished and o.delta.get("audio") is not None
    ]
    assert np.array_equal(np.concatenate(pieces), finals[2].audio)  # streamed == whole


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("use_audio_in_video", [False, True])
async def test_video_and_video_with_its_audio_offline(omni, reference, use_audio_in_video):
    messages = [{"role": "user", "content": [{"type": "video", "video": "x"}, text("what happens?")]}]
    mm = {"videos": [FRAMES], **({"audio": [CLIP]} if use_audio_in_video else {})}
    prompt, ref = reference_for(reference, messages, mm, use_audio_in_video=use_audio_in_video)
    data = {"video": FRAMES, **({"audio": (CLIP, media.RATE)} if use_audio_in_video else {})}
    _, finals = await run(
        omni,
        {"prompt": prompt, "multi_modal_data": data, "mm_processor_kwargs": {"use_audio_in_video": use_audio_in_video}},
    )
    assert_equal(finals, ref)


@pytest.mark.asyncio(loop_scope="module")
async def test_four_concurrent_media_requests_equal_their_solo_runs(omni):
    prompts = [{"messages": CHATS[name][0]} for name in CHATS]
    talker = omni.replicas(1)[0]
    before = len(talker.batch_sizes)
    together = await asyncio.gather(*(run(omni, p) for p in prompts))
    assert max(list(talker.batch_sizes)[before:]) >= 2  # they shared talker steps
    for prompt, (_, got) in zip(prompts, together):
        _, solo = await run(omni, prompt)
        assert got[0].token_ids == solo[0].token_ids
        assert np.abs(got[2].audio - solo[2].audio).max() <= TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_the_talker_conditioning_comes_from_the_thinker_engine_itself(omni):
    """No second engine and no second prefill: the thinker's own engine writes a spoken media prompt's rows (its
    KV connector), read with the first token; a text-out request asks for none; no file is left behind."""
    messages, _ = CHATS["audio"]
    thinker = omni.replicas(0)[0]
    assert thinker.engine.vllm_config.kv_transfer_config.kv_connector == "HiddenRowsConnector"
    before = thinker.rows_read
    _, spoken = await run(omni, {"messages": messages})  # its speech equals transformers (the tests above)
    assert thinker.rows_read == before + 1
    _, finals = await run(omni, {"messages": messages}, output_modalities=["text"])
    assert set(finals) == {0} and finals[0].text == spoken[0].text
    assert thinker.rows_read == before + 1
    _, finals = await run(omni, {"messages": [{"role": "user", "content": "hello"}]})  # no media: no rows
    assert finals[2].audio is not None and thinker.rows_read == before + 1
    assert os.listdir(thinker.rows_dir) == []


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "part, says",
    [
        ({"type": "input_audio", "input_audio": {"data": "bm90IGEgd2F2", "format": "wav"}}, "corrupted audio"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}, "base64"),
    ],
)
async def test_a_bad_media_part_is_refused_and_the_stages_keep_serving(omni, part, says):
    """Offline, vLLM loads the media and its complaint names the messages (over HTTP the server checks each
    part first and names it: tests/models/qwen_omni/server/test_http.py)."""
    with pytest.raises(InvalidRequestError) as e:
        await run(omni, {"messages": [{"role": "user", "content": [part, text("hi")]}]})
    assert e.value.field == "messages" and says in e.value.message
    _, finals = await run(omni, {"messages": CHATS["image"][0]})
    assert finals[2].audio is not None and omni.running_requests() == []
