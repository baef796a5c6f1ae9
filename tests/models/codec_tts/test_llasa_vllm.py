"""codec_tts with a Llasa-style folder (Llama speech LM + XCodec2) on vLLM, against the Llasa recipe
run with transformers: ``apply_chat_template(..., continue_final_message=True)`` for the prompt,
``generate`` for the codes, ``Xcodec2Model.encode`` for a reference clip (features by
``SeamlessM4TFeatureExtractor`` as the original XCodec2 code computes them) and
``Xcodec2Model.decode`` of reference + generated codes for the audio.

Two engines: the whole-sequence one (async chunk off) must equal the recipe; the streamed one must
equal the documented block schedule (each block decoded by transformers with its context and
lookahead) — XCodec2 is not causal, so streamed audio is not the whole decode (measured in
benchmarks/tts_streaming.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.config import NON_CAUSAL_CONTEXT, load_tts_config
from omnistage.pipeline import get_pipeline
from omnistage.testing.streams import all_outputs, finished_by_stage

pytestmark = pytest.mark.vllm

FRAMES = 30  # one token per XCodec2 frame
GREEDY = {"temperature": 0, "repetition_penalty": 1.0, "max_tokens": FRAMES, "min_tokens": FRAMES}
WHOLE_TOL = 1e-4  # the bound for audio vs the reference decode (measured ~1e-7: same ops, same lengths)
BLOCK_TOL = 1e-5  # streamed blocks vs the same windows decoded by transformers (batching: ~5e-8)
REF_TEXT = "a reference clip, spoken by someone."
DEPLOY_FIRST = 3  # initial_codec_chunk_frames in the streamed engine's deploy config


def observed_pipeline():
    base = get_pipeline("codec_tts")
    return replace(base, name="codec_tts_observed", stages=[replace(base.stages[0], final=True), base.stages[1]])


def clip(seconds: float, freq: float, seed: int, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).standard_normal(t.size)
    return (0.2 * np.sin(2 * np.pi * freq * t) + 0.05 * noise).astype(np.float32)


@pytest.fixture(scope="module")
def llasa_dir(tiny_model):
    return tiny_model("llasa")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(llasa_dir):
    args = {"max_model_len": 512, "dtype": "float32"}
    # the deploy's first block (3 frames) over the folder's (4); a request's own value wins over both
    deploy = {"stages": [{"stage_id": 1, "default_sampling_params": {"initial_codec_chunk_frames": DEPLOY_FIRST}}]}
    streamed = AsyncOmni(llasa_dir, pipeline=observed_pipeline(), deploy_config=deploy, **args)
    whole = AsyncOmni(llasa_dir, pipeline=observed_pipeline(), deploy_config={"async_chunk": False}, **args)
    await asyncio.gather(streamed.start(), whole.start())
    yield {"streamed": streamed, "whole": whole}
    await asyncio.gather(streamed.shutdown(), whole.shutdown())


@pytest.fixture(scope="module")
def recipe(llasa_dir):
    """The Llasa recipe with transformers: text (+ reference clip and transcript) -> (prompt ids, generated ids,
    reference codes, audio without the reference's part)."""
    from transformers import AutoTokenizer, LlamaForCausalLM, SeamlessM4TFeatureExtractor, Xcodec2Model

    cfg = load_tts_config(llasa_dir)
    tok = AutoTokenizer.from_pretrained(str(llasa_dir / "lm"))
    lm = LlamaForCausalLM.from_pretrained(str(llasa_dir / "lm"), dtype=torch.float32).eval()
    codec = Xcodec2Model.from_pretrained(str(llasa_dir / "codec")).eval()
    fe = SeamlessM4TFeatureExtractor(padding_value=1.0)
    end = tok.convert_tokens_to_ids("<|SPEECH_GENERATION_END|>")
    allowed = list(range(cfg.codec_token_offset, cfg.codec_token_offset + cfg.codebook_size)) + [end]
    hop = codec.config.hop_length

    def encode(audio: np.ndarray) -> list[int]:
        wav = np.pad(np.pad(audio, (0, 1)), (0, -(len(audio) + 1) % hop))  # whole frames (+1 sample, as XCodec2)
        feats = fe(np.pad(wav, (hop // 2, hop // 2)), sampling_rate=16000, return_tensors="pt")
        with torch.no_grad():
            out = codec.encode(
                torch.from_numpy(wav).view(1, 1, -1),
                feats["input_features"],
                input_features_mask=feats["attention_mask"],
            )
        return out.audio_codes[0, 0].tolist()

    def run(text: str, ref: np.ndarray | None = None):
        ref_codes = encode(ref) if ref is not None else []
        spoken = f"{REF_TEXT} {text}" if ref is not None else text
        chat = [
            {
                "role": "user",
                "content": f"Convert the text to speech:<|TEXT_UNDERSTANDING_START|>{spoken}<|TEXT_UNDERSTANDING_END|>",
            },
            {"role": "assistant", "content": "<|SPEECH_GENERATION_START|>" + "".join(f"<|s_{c}|>" for c in ref_codes)},
        ]
        prompt = tok.apply_chat_template(chat, tokenize=True, continue_final_message=True, return_dict=False)
        with torch.no_grad():
            out = lm.generate(
                torch.tensor([prompt]),
                max_new_tokens=FRAMES,
                min_new_tokens=FRAMES,
                do_sample=False,
                eos_token_id=end,
                pad_token_id=end,
                prefix_allowed_tokens_fn=lambda b, ids: allowed,
            )
        gen = out[0, len(prompt) :].tolist()
        codes = torch.tensor(ref_codes + [t - cfg.codec_token_offset for t in gen])
        with torch.no_grad():
            audio = codec.decode(audio_codes=codes.view(1, 1, -1)).audio_values[0, 0]
        return prompt, gen, ref_codes, audio[len(ref_codes) * hop :]

    run.codec = codec
    return run


def blockwise_reference(codec, codes: list[int], n_ref: int, first: int, chunk: int) -> torch.Tensor:
    """The documented streaming schedule: blocks [first, chunk, chunk, ...] after the reference codes, each
    decoded with NON_CAUSAL_CONTEXT frames before / after it."""
    left, ahead = NON_CAUSAL_CONTEXT
    hop = codec.config.hop_length
    codes_t = torch.tensor(codes).view(1, 1, -1)
    total, start, end, parts = len(codes), n_ref, n_ref + first, []
    while start < total:
        end = min(end, total)
        lo, hi = max(0, start - left), min(total, end + ahead)
        with torch.no_grad():
            audio = codec.decode(audio_codes=codes_t[..., lo:hi]).audio_values[0, 0]
        parts.append(audio[(start - lo) * hop : (end - lo) * hop])
        start, end = end, end + chunk
    return torch.cat(parts)


async def run(omni, prompt, params=GREEDY, codec_params=None, events=None):
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params, codec_params]))
    if events is not None:
        events.extend(outs)
    return finished_by_stage(outs)


def cloned(text: str, ref: np.ndarray, rate: int = 16000) -> dict:
    return {"prompt": text, "speech": {"ref_audio": (ref, rate), "ref_text": REF_TEXT}}


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("with_ref", [False, True], ids=["zero_shot", "cloned"])
async def test_whole_decode_equals_the_llasa_recipe(engines, recipe, with_ref):
    ref = clip(1.2, 220, seed=1) if with_ref else None
    prompt = cloned("hello world", ref) if with_ref else "hello world"
    finals = await run(engines["whole"], prompt)
    ref_prompt, ref_gen, ref_codes, ref_audio = recipe("hello world", ref)
    assert finals[0].prompt_token_ids == ref_prompt  # the Llasa chat prompt, reference codes included
    assert finals[0].token_ids == ref_gen
    audio = torch.from_numpy(finals[1].audio)
    assert finals[1].sample_rate == 16000 and audio.shape == ref_audio.shape == (FRAMES * 320,)
    assert (audio - ref_audio).abs().max().item() <= WHOLE_TOL
    assert ref_audio.abs().max().item() > 0.05  # the comparison is not between near-silences
    if with_ref:
        assert len(set(ref_codes)) > 5  # the reference really was encoded (not one constant code)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("with_ref", [False, True], ids=["zero_shot", "cloned"])
async def test_streamed_blocks_follow_the_schedule_and_start_early(engines, recipe, llasa_dir, with_ref):
    ref = clip(0.9, 330, seed=2) if with_ref else None
    prompt = cloned("good morning", ref) if with_ref else "good morning"
    events = []
    finals = await run(
        engines["streamed"], prompt, codec_params={"initial_codec_chunk_frames": 2, "chunk_frames": 8}, events=events
    )
    _, ref_gen, ref_codes, whole = recipe("good morning", ref)
    assert finals[0].token_ids == ref_gen
    codes = ref_codes + [t - load_tts_config(llasa_dir).codec_token_offset for t in ref_gen]
    expected = blockwise_reference(recipe.codec, codes, len(ref_codes), first=2, chunk=8)
    audio = torch.from_numpy(finals[1].audio)
    assert audio.shape == expected.shape == whole.shape
    assert (audio - expected).abs().max().item() <= BLOCK_TOL
    deltas = [len(o.delta["audio"]) for o in events if o.stage_id == 1 and o.delta.get("audio") is not None]
    assert deltas[0] == 2 * 320  # the small first chunk goes out on its own
    assert sum(deltas) == FRAMES * 320
    lm_done = next(i for i, o in enumerate(events) if o.stage_id == 0 and o.finished)
    first_audio = next(i for i, o in enumerate(events) if o.stage_id == 1 and o.delta.get("audio") is not None)
    assert first_audio < lm_done  # audio left while the LM was still generating


@pytest.mark.asyncio(loop_scope="module")
async def test_first_block_size_comes_from_the_deploy_config(engines, recipe, llasa_dir):
    """The block schedule is in the audio itself (each block decoded with its own context), whichever way the
    LM's tokens happened to be grouped on their way: it must be the deploy's first block, not the folder's."""
    cfg = load_tts_config(llasa_dir)
    assert cfg.initial_chunk_frames != DEPLOY_FIRST
    finals = await run(engines["streamed"], "hello world")
    _, ref_gen, _, _ = recipe("hello world")
    codes = [t - cfg.codec_token_offset for t in ref_gen]
    audio = torch.from_numpy(finals[1].audio)
    deploy = blockwise_reference(recipe.codec, codes, 0, first=DEPLOY_FIRST, chunk=cfg.chunk_frames)
    folder = blockwise_reference(recipe.codec, codes, 0, first=cfg.initial_chunk_frames, chunk=cfg.chunk_frames)
    assert (audio - deploy).abs().max().item() <= BLOCK_TOL
    assert (audio - folder).abs().max().item() > 1e-3


@pytest.mark.asyncio(loop_scope="module")
async def test_eight_concurrent_mixed_voices_equal_their_solo_runs(engines):
    omni = engines["streamed"]
    refs = [clip(0.8, 200, seed=3), clip(1.0, 410, seed=4)]
    prompts = [
        cloned("hello world", refs[0]),
        "good morning",
        cloned("the lazy dog", refs[1]),
        "hello world",
        cloned("good morning", refs[0]),
        "the quick brown fox",
        cloned("hello world", refs[1]),
        "i am fine",
    ]
    adapter = omni.replicas(1)[0].adapter
    before = len(adapter.calls)
    together = await asyncio.gather(*(run(omni, p) for p in prompts))
    assert max(adapter.calls[before:]) >= 2  # windows of different requests shared decode calls
    for prompt, got in zip(prompts, together):
        solo = await run(omni, prompt)
        assert got[0].token_ids == solo[0].token_ids
        assert np.abs(got[1].audio - solo[1].audio).max() <= BLOCK_TOL


@pytest.mark.asyncio(loop_scope="module")
async def test_resampled_reference_and_cache(engines):
    """A 24 kHz clip is resampled to the codec's 16 kHz before encoding (once, soxr HQ, as every input); the same
    clip is encoded once."""
    import soxr

    omni = engines["whole"]
    ref24 = clip(1.0, 300, seed=5, rate=24000)
    a = await run(omni, cloned("hello world", ref24, 24000))
    b = await run(omni, cloned("hello world", soxr.resample(ref24, 24000, 16000, quality="HQ"), 16000))
    assert a[0].prompt_token_ids == b[0].prompt_token_ids and a[0].token_ids == b[0].token_ids
    lm = omni.replicas(0)[0]
    cached = len(lm._ref_cache)
    await run(omni, cloned("good morning", ref24, 24000))
    assert len(lm._ref_cache) == cached


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "info, field",
    [
        ({"ref_text": REF_TEXT}, "ref_text"),  # a transcript without its clip
        ({"ref_audio": (clip(0.5, 200, 0), 16000)}, "ref_text"),  # a clip without its transcript
        ({"ref_audio": (clip(31, 200, 0), 16000), "ref_text": REF_TEXT}, "ref_audio"),  # longer than max_ref_audio_s
        ({"ref_audio": (np.full(800, np.nan, np.float32), 16000), "ref_text": REF_TEXT}, "ref_audio"),
        ({"ref_audio": (clip(0.5, 200, 0), 0), "ref_text": REF_TEXT}, "ref_audio"),
        ({"ref_audio": (clip(0.5, 200, 0), 16000), "ref_text": REF_TEXT, "voice": "alto"}, "voice"),
        ({"ref_codes": [[70, 1]], "ref_text": REF_TEXT}, "ref_codes"),  # 70 is outside the 64 codes
        ({"language": "de"}, "language"),
        ({"voice": "alto"}, "voice"),  # the folder has no preset voices
    ],
)
async def test_bad_cloning_inputs_name_the_field(engines, info, field):
    with pytest.raises(InvalidRequestError) as e:
        await run(engines["whole"], {"prompt": "hi", "speech": info})
    assert e.value.field == field


@pytest.mark.asyncio(loop_scope="module")
async def test_codec_stage_params_are_checked(engines):
    with pytest.raises(InvalidRequestError) as e:
        await run(engines["streamed"], "hi", codec_params={"initial_codec_chunk_frames": 0})
    assert e.value.field == "initial_codec_chunk_frames"
