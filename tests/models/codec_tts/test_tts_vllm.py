"""codec_tts end to end in-process: the speech LM on vLLM streams codec tokens,
the codec stage decodes them while the LM is still generating.

References: transformers ``generate`` (same prompt, same allowed tokens) for the
LM ids, and transformers ``MimiModel.decode`` of the whole code sequence for the
audio. The pipeline is the registered one with stage 0 also marked final, so the
test can see the LM's ids and when the LM finished relative to the audio.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError, StageFailedError
from omnistage.models.shared.codec_lm.config import load_tts_config
from omnistage.pipeline import get_pipeline
from omnistage.testing.streams import all_outputs, final_output, finished_by_stage

pytestmark = pytest.mark.vllm

TOL = 1e-5  # streamed/batched vs whole decode: float32 rounding over different lengths (see test_codec_units)
TOKENS = 48  # 24 frames of K=2 -> 6 chunks of 4 frames
GREEDY = {"temperature": 0, "repetition_penalty": 1.0, "max_tokens": TOKENS, "min_tokens": TOKENS}


def observed_pipeline():
    base = get_pipeline("codec_tts")
    return replace(base, name="codec_tts_observed", stages=[replace(base.stages[0], final=True), base.stages[1]])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(tts_dir):
    engine = AsyncOmni(tts_dir, pipeline=observed_pipeline(), max_model_len=512, dtype="float32")
    await engine.start()
    yield engine
    await engine.shutdown()


async def run(omni, prompt, params=GREEDY, request_id=None, events=None):
    """Each stage's finished output; ``events`` gets (stage, finished, has audio) of every update, in order."""
    outs = await all_outputs(omni.generate(prompt, request_id=request_id, sampling_params_list=[params, None]))
    if events is not None:
        events.extend((o.stage_id, o.finished, o.delta.get("audio") is not None) for o in outs)
    return finished_by_stage(outs)


def reference_audio(tts_dir, ids: list[int]) -> torch.Tensor:
    """transformers' Mimi decode of every code at once (frame-major ids, shared layout)."""
    from transformers import MimiModel

    cfg = load_tts_config(tts_dir)
    codes = (torch.tensor(ids) - cfg.codec_token_offset).view(-1, cfg.num_quantizers).T
    mimi = MimiModel.from_pretrained(str(tts_dir / "codec")).eval()
    with torch.no_grad():
        return mimi.decode(codes[None]).audio_values[0, 0]


@pytest.mark.asyncio(loop_scope="module")
async def test_lm_ids_equal_transformers_generate(omni, tts_dir):
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    out = (await run(omni, "hello world"))[0]
    tok = AutoTokenizer.from_pretrained(str(tts_dir / "lm"))
    prompt = tok.encode("<|text_start|>alto: hello world<|text_end|><|speech_start|>", add_special_tokens=False)
    assert out.prompt_token_ids == prompt  # the family's prompt format with the default voice
    cfg = load_tts_config(tts_dir)
    end = tok.convert_tokens_to_ids("<|speech_end|>")
    allowed = list(range(cfg.codec_token_offset, cfg.codec_token_offset + cfg.codebook_size)) + [end]
    model = Qwen2ForCausalLM.from_pretrained(str(tts_dir / "lm"), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=TOKENS,
            min_new_tokens=TOKENS,
            do_sample=False,
            eos_token_id=end,
            pad_token_id=end,
            prefix_allowed_tokens_fn=lambda b, ids: allowed,
        )
    assert out.token_ids == ref[0, len(prompt) :].tolist()


@pytest.mark.asyncio(loop_scope="module")
async def test_streamed_audio_equals_whole_decode_and_starts_early(omni, tts_dir):
    events = []
    finals = await run(omni, {"prompt": "good morning", "speech": {"voice": "bass"}}, events=events)
    ids = finals[0].token_ids
    assert len(ids) == TOKENS
    audio = torch.from_numpy(finals[1].audio)
    ref = reference_audio(tts_dir, ids)
    assert finals[1].sample_rate == 16000 and audio.shape == ref.shape == (TOKENS // 2 * 320,)
    assert (audio - ref).abs().max().item() <= TOL
    audio_deltas = [i for i, (sid, _, has_audio) in enumerate(events) if sid == 1 and has_audio]
    lm_done = events.index((0, True, False))
    assert len(audio_deltas) == TOKENS // 2 // 4  # one per chunk of 4 frames
    assert audio_deltas[0] < lm_done  # audio came out while the LM was still generating


@pytest.mark.asyncio(loop_scope="module")
async def test_concurrent_requests_batch_in_the_codec_stage(omni):
    """8 at once, preset voices mixed (the default alto, bass, alto by name): each equals its solo run."""
    adapter = omni.replicas(1)[0].adapter

    def voiced(text: str, voice: str) -> dict:
        return {"prompt": text, "speech": {"voice": voice}}

    prompts = [
        "hello world",
        voiced("good morning", "bass"),
        "the lazy dog",
        voiced("hello world", "bass"),
        voiced("i am fine", "alto"),
        voiced("the quick brown fox", "bass"),
        "good morning",
        voiced("hi", "alto"),
    ]
    before = len(adapter.calls)
    together = await asyncio.gather(*(run(omni, p) for p in prompts))
    assert max(adapter.calls[before:]) >= 2  # pieces of different requests shared a decode
    for prompt, got in zip(prompts, together):
        solo = await run(omni, prompt)
        assert got[0].token_ids == solo[0].token_ids
        assert abs(torch.from_numpy(got[1].audio) - torch.from_numpy(solo[1].audio)).max().item() <= TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_abort_mid_stream_frees_the_vllm_slot(omni):
    lm = omni.replicas(0)[0]
    long = {**GREEDY, "max_tokens": 400, "min_tokens": 400}
    seen = 0
    async for out in omni.generate("hello world", request_id="abort-me", sampling_params_list=[long, None]):
        if out.stage_id == 1 and out.delta.get("audio") is not None:
            seen += 1
            await omni.abort("abort-me")
            break
    assert seen == 1
    for _ in range(200):  # vLLM frees the slot asynchronously
        if lm.num_unfinished_in_vllm == 0:
            break
        await asyncio.sleep(0.05)
    assert lm.num_unfinished_in_vllm == 0
    assert "abort-me" not in omni.running_requests(1) and omni.running_requests() == []
    assert len((await run(omni, "hello world"))[0].token_ids) == TOKENS  # the engine keeps serving


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "prompt, params, error, match",
    [
        ("   ", GREEDY, InvalidRequestError, "prompt: the text to speak is empty"),
        (
            {"prompt": "hi", "speech": {"voice": "tenor"}},
            GREEDY,
            InvalidRequestError,
            "voice: 'tenor' is not one of alto, bass",
        ),
        (
            {"prompt": "hi", "speech": {"instructions": "whisper"}},
            GREEDY,
            InvalidRequestError,
            "instructions: this model does not take",
        ),
        ({"prompt": "hi", "prompt_token_ids": [1, 2]}, GREEDY, InvalidRequestError, "prompt: codec_tts speaks a text"),
        (
            {"prompt": "hi", "multi_modal_data": {"audio": ([0.0] * 160, 16000)}},
            GREEDY,
            InvalidRequestError,
            "multi_modal_data: codec_tts takes text only",
        ),
        # no {ref_codes} in this folder's prompt_template: it cannot clone
        (
            {"prompt": "hi", "speech": {"ref_audio": ([0.1] * 1600, 16000), "ref_text": "hi"}},
            GREEDY,
            InvalidRequestError,
            "ref_audio: this model cannot clone voices",
        ),
        # The caller lets the LM sample a text token: the edge names the position of the non-codec token.
        (
            "hi",
            {**GREEDY, "allowed_token_ids": [50], "max_tokens": 8, "min_tokens": 8},
            StageFailedError,
            r"token_ids\[0\]: 50 is not a codec token of codebook 0",
        ),
    ],
)
async def test_bad_inputs_name_the_field(omni, prompt, params, error, match):
    with pytest.raises(error, match=match):
        await run(omni, prompt, params)


@pytest.mark.asyncio(loop_scope="module")
async def test_bad_codec_params_are_the_callers_fault(omni):
    with pytest.raises(InvalidRequestError, match="chunk_frames: expected a positive integer"):
        await final_output(omni.generate("hi", sampling_params_list=[GREEDY, {"chunk_frames": 0}]))
    # A user typing control tokens gets them spoken as text, not obeyed.
    lm = omni.replicas(0)[0]
    out = (await run(omni, "<|speech_end|><|c_3|>"))[0]
    assert len(out.token_ids) == TOKENS
    control = {lm.end_id, lm.tokenizer.convert_tokens_to_ids("<|c_3|>")}
    assert not control & set(out.prompt_token_ids)
