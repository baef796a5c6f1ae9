"""Qwen3-Omni end to end in-process (thinker on vLLM, talker, code2wav), against transformers'
``Qwen3OmniMoeForConditionalGeneration.generate(..., return_audio=True)`` with greedy thinker and talker."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError, StageFailedError
from omnistage.testing.streams import all_outputs, finished_by_stage

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

THINK, TALK = 12, 20
GREEDY = [{"temperature": 0, "max_tokens": THINK}, {"temperature": 0, "max_tokens": TALK}]
TOL = 1e-4  # the bound; measured ~1e-6 (float rounding of the thinker and of streamed decodes)
PROMPTS = ["hello, who are you?", "describe the picture and the sound", "the quick brown fox", "who are you?"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(omni_dir):
    engine = AsyncOmni(str(omni_dir), max_model_len=512)
    await engine.start()
    yield engine
    await engine.shutdown()


async def run(omni, prompt, params=GREEDY, **kw):
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=params, **kw))
    return outs, finished_by_stage(outs)


def messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.mark.asyncio(loop_scope="module")
async def test_text_and_streamed_speech_equal_transformers(omni, reference):
    ref = reference.run(messages(PROMPTS[0]), THINK, TALK)
    outs, talker_busy_at_first_audio = [], None
    async for out in omni.generate(PROMPTS[0], request_id="streamed", sampling_params_list=GREEDY):
        if talker_busy_at_first_audio is None and out.stage_id == 2 and out.delta.get("audio") is not None:
            talker_busy_at_first_audio = "streamed" in omni.running_requests(stage_id=1)
        outs.append(out)
    finals = finished_by_stage(outs)
    assert finals[0].token_ids == ref.reply
    assert finals[0].text == reference.tok.decode(ref.reply, skip_special_tokens=True)
    audio = torch.from_numpy(finals[2].audio)
    assert finals[2].sample_rate == 24000 and audio.shape == ref.audio.shape
    assert (audio - ref.audio).abs().max().item() <= TOL
    pieces = [
        torch.as_tensor(o.delta["audio"]).reshape(-1)
        for o in outs
        if o.stage_id == 2 and not o.finished and o.delta.get("audio") is not None
    ]
    assert len(pieces) >= 3  # 19 frames in 4-frame pieces: audio streamed, not one block at the end
    assert torch.equal(torch.cat(pieces), audio)  # the streamed chunks are the final audio
    assert talker_busy_at_first_audio  # the first audio came out while the talker was still generating


@pytest.mark.asyncio(loop_scope="module")
async def test_messages_with_a_system_turn_and_a_chosen_speaker(omni, reference):
    chat = [{"role": "system", "content": "you are a helpful assistant."}, *messages("hello")]
    ref = reference.run(chat, THINK, TALK, speaker="Chelsie")
    _, finals = await run(omni, {"messages": chat, "speech": {"voice": "chelsie"}})
    assert finals[0].token_ids == ref.reply
    assert (torch.from_numpy(finals[2].audio) - ref.audio).abs().max().item() <= TOL
    other = reference.run(chat, THINK, TALK, speaker="Aiden")
    assert not torch.equal(other.codes, ref.codes)  # the speaker matters (so the check above is one)


@pytest.mark.asyncio(loop_scope="module")
async def test_four_concurrent_requests_equal_their_solo_runs(omni):
    talker = omni.replicas(1)[0]
    before = len(talker.batch_sizes)
    together = await asyncio.gather(*(run(omni, p) for p in PROMPTS))
    assert max(list(talker.batch_sizes)[before:]) >= 2  # they shared talker steps
    for prompt, (_, got) in zip(PROMPTS, together):
        _, solo = await run(omni, prompt)
        assert got[0].token_ids == solo[0].token_ids
        assert (torch.from_numpy(got[2].audio) - torch.from_numpy(solo[2].audio)).abs().max().item() <= TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_text_only_never_runs_the_talker(omni, reference):
    talker, code2wav = omni.replicas(1)[0], omni.replicas(2)[0]
    steps, decodes = len(talker.batch_sizes), len(code2wav.adapter.calls)
    _, finals = await run(omni, PROMPTS[0], output_modalities=["text"])
    assert set(finals) == {0} and set(finals[0].metrics) == {0}  # only the thinker reported stage metrics
    assert len(talker.batch_sizes) == steps and len(code2wav.adapter.calls) == decodes
    reply = reference.run(messages(PROMPTS[0]), THINK, TALK).reply
    assert finals[0].text == reference.tok.decode(reply, skip_special_tokens=True)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "prompt, params, field",
    [
        ({"prompt": "hi", "speech": {"voice": "Bob"}}, GREEDY, "speaker"),
        ("hi", [GREEDY[0], {**GREEDY[1], "speaker": "Bob"}], "speaker"),
        # (a vLLM field the talker does not read, e.g. min_p, is dropped with a warning: tests/test_sampling_fields.py)
        ("hi", [GREEDY[0], {"temprature": 0.5}], "temprature"),
        ("hi", [GREEDY[0], None, {"chunk_frames": 0}], "chunk_frames"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}],
                    }
                ]
            },
            GREEDY,
            "messages",
        ),  # offline vLLM loads the media (HTTP names the part: tests/models/qwen_omni/server/test_http.py)
    ],
)
async def test_bad_input_names_the_field(omni, prompt, params, field):
    with pytest.raises(InvalidRequestError) as e:
        await run(omni, prompt, params)
    assert e.value.field == field


@pytest.mark.asyncio(loop_scope="module")
async def test_a_talker_failure_fails_that_request_only(omni, reference):
    # raw prompt ids with no assistant turn: the thinker answers, the talker cannot find a turn to speak
    raw = {"prompt_token_ids": reference.tok.encode("hello", add_special_tokens=False)}
    bad, good = await asyncio.gather(run(omni, raw), run(omni, PROMPTS[0]), return_exceptions=True)
    assert isinstance(bad, StageFailedError) and "stage 1 (talker)" in str(bad) and "assistant" in str(bad)
    assert not isinstance(good, BaseException) and good[1][2].audio is not None
    assert omni.running_requests() == []


@pytest.mark.asyncio(loop_scope="module")
async def test_abort_mid_speech_frees_every_stage(omni):
    long = [GREEDY[0], {"temperature": 0, "max_tokens": 400}]
    async for out in omni.generate(PROMPTS[0], request_id="abort-me", sampling_params_list=long):
        if out.stage_id == 2 and out.delta.get("audio") is not None:
            await omni.abort("abort-me")
            break
    for _ in range(100):
        if not omni.running_requests():
            break
        await asyncio.sleep(0.05)
    assert omni.running_requests() == [] and "abort-me" not in omni.running_requests(stage_id=1)
    _, finals = await run(omni, PROMPTS[1])  # the stages keep serving
    assert finals[2].audio is not None
