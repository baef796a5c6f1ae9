"""The ``whisper`` family on a real vLLM engine (CPU): its text and token ids equal vLLM's own
``LLM.generate`` on the explicit encoder-decoder prompt, and transformers'
``WhisperForConditionalGeneration.generate`` (greedy) on the same tiny model; bad requests are 400s
naming the field.

One AsyncOmni engine for the module; the references are computed here, from the same folder.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.errors import InvalidRequestError
from omnistage.models.shared.whisper.prompt import decoder_prompt
from omnistage.pipeline import resolve_pipeline
from tests.models.asr_cases import RATE, request, run
from tests.models.offline_llm import offline_llm

from .cases import CASES, CLIPS, ENGINE, MAX_TOKENS

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def whisper_dir(tiny_model):
    return tiny_model("whisper")


@pytest.fixture(scope="module")
def hf_reference(whisper_dir):
    """transformers' Whisper generate, greedy: (clip, case) -> generated ids."""
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(1)
    proc = WhisperProcessor.from_pretrained(whisper_dir)
    model = WhisperForConditionalGeneration.from_pretrained(whisper_dir).eval()
    out = {}
    for i, audio in enumerate(CLIPS):
        feats = proc(audio, sampling_rate=RATE, return_tensors="pt").input_features
        for j, (language, task, previous) in enumerate(CASES):
            kw = {"prompt_ids": torch.tensor(proc.get_prompt_ids(previous))} if previous else {}
            with torch.no_grad():
                ids = model.generate(
                    feats, language=language, task=task, do_sample=False, max_new_tokens=MAX_TOKENS, **kw
                )
            out[i, j] = [int(t) for t in ids[0]]
    return out


@pytest.fixture(scope="module")
def vllm_reference(whisper_dir):
    """vLLM's own offline LLM.generate on the explicit prompt: (clip, case) -> (ids, text)."""
    from vllm import SamplingParams

    with offline_llm(whisper_dir, **ENGINE) as llm:
        keys, prompts = [], []
        for i, audio in enumerate(CLIPS):
            for j, (language, task, previous) in enumerate(CASES):
                keys.append((i, j))
                prompts.append(
                    {
                        "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, RATE)}},
                        "decoder_prompt": decoder_prompt(language, task, previous),
                    }
                )
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
        return {k: (list(o.outputs[0].token_ids), o.outputs[0].text) for k, o in zip(keys, outs)}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(whisper_dir, vllm_reference):
    engine = AsyncOmni(whisper_dir, stage_overrides={"0": {"engine_output_type": "text+token_ids"}}, **ENGINE)
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_folder_resolves_to_whisper(whisper_dir):
    assert resolve_pipeline(whisper_dir).name == "whisper"


def hf_comparable(key) -> bool:
    """vLLM puts the decoder start token in front of a decoder prompt that does not begin with it
    (inputs/engine.py ``_prepare_decoder_input_ids_for_generation``), so a previous-text prompt
    (``<|startofprev|> ...``) reaches vLLM's Whisper one token longer than transformers' ``prompt_ids``."""
    return not CASES[key[1]][2]


async def test_vllm_equals_transformers(hf_reference, vllm_reference):
    """The two references agree first (so a failure below is the family's, not the tiny model's)."""
    compared = [key for key in vllm_reference if hf_comparable(key)]
    assert len(compared) == 9
    for key in compared:
        assert vllm_reference[key][0] == hf_reference[key], key


async def test_previous_text_prompt_differs_from_transformers_by_the_start_token(hf_reference, vllm_reference):
    """Documents the one known difference (see hf_comparable): it is real, not a tokenization slip."""
    for key in vllm_reference:
        if not hf_comparable(key):
            assert vllm_reference[key][0] != hf_reference[key]


async def test_family_equals_references(omni, vllm_reference, hf_reference):
    # every clip and case in flight together: continuous batching must not change anyone's output
    keys = list(vllm_reference)
    results = await asyncio.gather(*(run(omni, request(CLIPS[i], *CASES[j]), max_tokens=MAX_TOKENS) for i, j in keys))
    texts = set()
    for key, (out, deltas) in zip(keys, results):
        ref_ids, ref_text = vllm_reference[key]
        assert out.token_ids == ref_ids, key
        if hf_comparable(key):
            assert out.token_ids == hf_reference[key], key
        assert out.text == ref_text
        assert "".join(d.get("text", "") for d in deltas) == ref_text
        assert out.finish_reason == "length"
        texts.add(ref_text)
    assert len(texts) > 1  # the clips and prompts make a difference


async def test_default_is_greedy_with_whisper_sample_len(omni, vllm_reference):
    """No params: temperature 0 and openai-whisper's 224-token sample length."""
    out, _ = await run(omni, request(CLIPS[0]))
    assert out.token_ids[:MAX_TOKENS] == vllm_reference[0, 0][0]
    assert out.finish_reason == "stop" or len(out.token_ids) == 224


async def test_explicit_encoder_decoder_prompt(omni, vllm_reference):
    prompt = {
        "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (CLIPS[1], RATE)}},
        "decoder_prompt": decoder_prompt("de"),
    }
    out, _ = await run(omni, prompt, max_tokens=MAX_TOKENS)
    assert out.token_ids == vllm_reference[1, 1][0]


@pytest.mark.parametrize(
    "prompt, field",
    [
        ({"prompt": ""}, "multi_modal_data.audio"),
        (request(CLIPS[0], language="xx"), "language"),
        (request(CLIPS[0], task="summarize"), "task"),
        ({"encoder_prompt": "audio", "decoder_prompt": ""}, "encoder_prompt"),
        (
            {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (CLIPS[0], RATE)}}, "decoder_prompt": 3},
            "decoder_prompt",
        ),
    ],
)
async def test_bad_requests_name_the_field(omni, prompt, field):
    with pytest.raises(InvalidRequestError) as e:
        await run(omni, prompt, max_tokens=4)
    assert e.value.field == field
    out, _ = await run(omni, request(CLIPS[0]), max_tokens=2)  # the engine keeps serving
    assert out.finished


async def test_language_tokens_are_the_checkpoints(whisper_dir, tmp_path):
    """Detection chooses among the folder's own language tokens (``lang_to_id``); a folder without them
    (an English-only checkpoint) detects nothing."""
    from transformers import WhisperTokenizer

    from omnistage.models.whisper import WHISPER, folder_info

    ids = folder_info(whisper_dir, WHISPER.info).transcription.language_token_ids
    tok = WhisperTokenizer.from_pretrained(whisper_dir)
    assert len(ids) == 100 and ids == {code: tok.convert_tokens_to_ids(f"<|{code}|>") for code in ids}
    (tmp_path / "generation_config.json").write_text('{"decoder_start_token_id": 1}')
    assert folder_info(tmp_path, WHISPER.info) == WHISPER.info
