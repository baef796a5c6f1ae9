"""Whisper's timestamp rules (omnistage/models/shared/whisper/timestamps.py) and the segments cut from them, against
transformers' Whisper on the tiny fixture.

- The rules alone, no engine: ``TimestampRules`` on random logits and token histories gives transformers'
  ``WhisperTimeStampLogitsProcessor``'s logits exactly (with and without a first timestamp in the prompt, with
  and without ``max_initial_timestamp_index``).
- The family on vLLM, greedy, asked for timestamps as the transcription route asks (``Transcription.
  timestamps``, ``logprobs: 1``): its tokens are transformers' ``generate(return_timestamps=True)``'s, its
  log-probabilities are the log-softmax of transformers' raw logits, and the segments cut from its tokens
  (omnistage/server/segments.py) are transformers' segments (times past the clip's audio held at its end).
- The same prompt with the rules off (what ``vllm serve`` samples): at least one case picks a token that
  transformers' processor forbids, so the rules are what makes the two equal.

How transformers gets the same decoder prompt: ``generate`` builds the prompt itself
(``<|startoftranscript|><|en|><|transcribe|>`` with ``return_timestamps``) and counts every token after it as
sampled, so ``decoder_input_ids`` ending in ``<|0.00|>`` would make its processor force a second first
timestamp (``begin_index`` is set to the prompt's length). With ``max_initial_timestamp_index=0`` its first
token can only be ``<|0.00|>``: from then on its decoder sees our prompt ``...<|transcribe|><|0.00|>`` token for
token and its rules see the sequence ours see (ours count the prompt's ``<|0.00|>`` as sampled), so its output
is ours with ``<|0.00|>`` in front. ``force_unique_generate_call``: one window, no seeking into a second call.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch

from omnistage import AsyncOmni
from omnistage.models.shared.whisper.prompt import decoder_prompt
from omnistage.models.shared.whisper.timestamps import TimestampRules, TimestampTokens
from omnistage.server.segments import tokenizer, window_segments
from tests.models.asr_cases import RATE, clip

from .cases import CASES, CLIPS, ENGINE, between_timestamps

pytestmark = pytest.mark.vllm

MAX_TOKENS = 24
AUDIO = CLIPS + [clip(29.5, 12)]  # three short clips (their times get held at the end) and an almost full window
# en, de, fr->en: no previous text (transformers' prompt differs there, test_whisper_vllm.py's hf_comparable)
KEYS = [(i, j) for i in range(len(AUDIO)) for j in range(3)]


@pytest.fixture(scope="module")
def whisper_dir(tiny_model):
    return tiny_model("whisper")


@pytest.fixture(scope="module")
def hf(whisper_dir):
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(1)
    proc = WhisperProcessor.from_pretrained(whisper_dir)
    model = WhisperForConditionalGeneration.from_pretrained(whisper_dir).eval()
    return proc, model


def first_timestamp_zero(model):
    config = copy.deepcopy(model.generation_config)
    config.max_initial_timestamp_index = 0
    return config


@pytest.fixture(scope="module")
def hf_reference(hf):
    """transformers, greedy, timestamps: key -> (generated ids after its forced <|0.00|>, raw log-probabilities of
    them, its segments as (start, end, token ids))."""
    proc, model = hf
    config = first_timestamp_zero(model)
    out = {}
    for i, j in KEYS:
        language, task, _ = CASES[j]
        feats = proc(AUDIO[i], sampling_rate=RATE, return_tensors="pt").input_features
        kw = dict(
            generation_config=config,
            language=language,
            task=task,
            do_sample=False,
            max_new_tokens=MAX_TOKENS + 1,
            return_timestamps=True,
            force_unique_generate_call=True,
        )
        with torch.no_grad():
            cut = model.generate(feats, return_segments=True, **kw)
            scored = model.generate(feats, return_dict_in_generate=True, output_logits=True, **kw)
        seq = scored.sequences[0].tolist()
        assert seq[3] == config.no_timestamps_token_id + 1  # its first token: the <|0.00|> our prompt ends with
        ids = seq[4:]
        logprobs = [torch.log_softmax(step[0].double(), -1)[t].item() for step, t in zip(scored.logits[1:], ids)]
        segments = [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in cut["segments"][0]]
        out[i, j] = ids, logprobs, segments
    return out


async def run(omni, prompt, params):
    ids, logprobs = [], []
    async for out in omni.generate(prompt, sampling_params_list=[params]):
        logprobs += out.delta.get("logprobs") or []
        if out.finished:
            ids = out.token_ids
    return ids, logprobs


def asked(i, j):
    """The recogniser request the transcription route sends for verbose_json / srt / vtt."""
    language, task, _ = CASES[j]
    return (
        {
            "prompt": "",
            "multi_modal_data": {"audio": (AUDIO[i], RATE)},
            "transcription": {"language": language, "task": task, "timestamps": True},
        },
        {"max_tokens": MAX_TOKENS, "logprobs": 1},
    )


def rules_off(i, j):
    """The same decoder prompt, sampled freely (as ``vllm serve`` samples its verbose prompt)."""
    language, task, _ = CASES[j]
    return (
        {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (AUDIO[i], RATE)}},
            "decoder_prompt": decoder_prompt(language, task, timestamps=True),
        },
        {"max_tokens": MAX_TOKENS},
    )


@pytest.fixture(scope="module")
def ours(whisper_dir, hf_reference):
    """The family's outputs, both kinds of request in flight together (the rules must bite only where asked):
    (key -> (ids, log-probabilities) asked for timestamps, key -> ids with the rules off)."""

    async def both():
        engine = AsyncOmni(whisper_dir, stage_overrides={"0": {"engine_output_type": "text+token_ids"}}, **ENGINE)
        await engine.start()
        try:
            on = [run(engine, *asked(*k)) for k in KEYS]
            off = [run(engine, *rules_off(*k)) for k in KEYS]
            return await asyncio.gather(*on, *off)
        finally:
            await engine.shutdown()

    results = asyncio.run(both())
    return dict(zip(KEYS, results[: len(KEYS)])), dict(zip(KEYS, (ids for ids, _ in results[len(KEYS) :])))


def test_rules_equal_transformers_processor(whisper_dir, hf):
    """Random logits (timestamps now more, now less likely than text) after random histories of text, special
    and timestamp tokens: our logits are transformers' processor's, masks and the summed-probability rule."""
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    _, model = hf
    tokens = TimestampTokens.from_generation_config(json.loads((whisper_dir / "generation_config.json").read_text()))
    config = model.generation_config
    assert (tokens.no_timestamps, tokens.eos) == (config.no_timestamps_token_id, config.eos_token_id)
    begin, vocab = tokens.begin, model.config.vocab_size
    prompt = [config.decoder_start_token_id, config.lang_to_id["<|en|>"], config.task_to_id["transcribe"]]
    gen = torch.Generator().manual_seed(0)
    forced = 0
    for max_initial in (None, 50):
        hf_config = copy.deepcopy(config)
        hf_config.max_initial_timestamp_index = max_initial
        ours = TimestampRules(TimestampTokens(tokens.no_timestamps, tokens.eos, max_initial))
        for given in (True, False):
            for _trial in range(150):
                pools = [
                    torch.randint(0, tokens.eos, (6,), generator=gen),  # text
                    torch.randint(tokens.eos, begin, (6,), generator=gen),  # special tokens
                    torch.randint(begin, vocab, (6,), generator=gen).sort().values,
                ]  # timestamps
                kinds = torch.randint(0, 3, (int(torch.randint(0, 7, (1,), generator=gen)),), generator=gen)
                history = [int(pools[k][n]) for n, k in enumerate(kinds.tolist())]
                logits = torch.randn(vocab, generator=gen) * 3
                logits[begin:] += float(torch.empty(1).uniform_(-6, 3, generator=gen))
                full = prompt + ([begin] if given else [])
                # transformers: the prompt's <|0.00|> is the first sampled token (begin_index before it)
                theirs = WhisperTimeStampLogitsProcessor(hf_config, begin_index=len(prompt))(
                    torch.tensor([full + history]), logits[None].clone()
                )[0]
                assert torch.equal(ours(full, history, logits.clone()), theirs), (max_initial, given, history)
                unforced = WhisperTimeStampLogitsProcessor(
                    hf_config, begin_index=len(prompt), _detect_timestamp_from_logprob=False
                )(torch.tensor([full + history]), logits[None].clone())[0]
                forced += not torch.equal(theirs, unforced)
    assert 0 < forced < 600  # the summed-probability rule decided some cases, not all


def test_tokens_equal_transformers(ours, hf_reference):
    asked_out, _ = ours
    for key in KEYS:
        ids, logprobs = asked_out[key]
        ref_ids, ref_logprobs, _ = hf_reference[key]
        assert ids == ref_ids, key
        assert logprobs == pytest.approx(ref_logprobs, abs=1e-4), key  # vLLM's raw log-probabilities


def test_segments_equal_transformers(whisper_dir, ours, hf_reference):
    asked_out, _ = ours
    tok = tokenizer(str(whisper_dir))
    begin = tok.convert_tokens_to_ids("<|0.00|>")
    spec = {"timestamp_begin": begin, "seconds_per_timestamp": 0.02}
    paired = held = 0
    for key in KEYS:
        ids, logprobs = asked_out[key]
        seconds = AUDIO[key[0]].size / RATE
        segments = window_segments(
            ids, logprobs, 0.0, seconds, "the window's text", spec, tok.decode, tok.eos_token_id, seek=0
        )
        theirs = hf_reference[key][2]
        if any(a >= begin and b >= begin for a, b in zip(ids, ids[1:])):  # a timestamp pair: segments inside
            paired += 1
            assert [(s.start, s.end, s.tokens) for s in segments] == [
                (pytest.approx(min(a, seconds)), pytest.approx(min(b, seconds)), between_timestamps(t_ids, begin))
                for a, b, t_ids in theirs
            ], key
            assert [s.text for s in segments] == [tok.decode(s.tokens) for s in segments]
            held += any(b > seconds for _, b, _ in theirs)
        else:  # no pair: transformers' one segment is the whole decoding; ours the whole window
            assert len(theirs) == 1 and [(s.start, s.end, s.text, s.tokens) for s in segments] == [
                (0.0, seconds, "the window's text", ids)
            ], key
        assert all(x.end <= y.start for x, y in zip(segments, segments[1:]))
        assert all(0 <= s.start <= s.end <= seconds for s in segments)
    assert paired >= 3 and held >= 1  # cases with segments inside the window, and with times past the audio


def test_rules_off_breaks_them(hf, ours, hf_reference):
    """The prompt alone does not make Whisper's timestamps: sampled freely, some case picks a token that
    transformers' processor forbids at that step (on transformers' own logits for that history)."""
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    proc, model = hf
    config = model.generation_config
    _, off = ours
    broken = []
    for key in KEYS:
        ids = off[key]
        language, task, _ = CASES[key[1]]
        prompt = proc.tokenizer.convert_tokens_to_ids(
            ["<|startoftranscript|>", f"<|{language}|>", f"<|{task}|>", "<|0.00|>"]
        )
        feats = proc(AUDIO[key[0]], sampling_rate=RATE, return_tensors="pt").input_features
        seq = torch.tensor([prompt + ids])
        with torch.no_grad():
            logits = model(input_features=feats, decoder_input_ids=seq).logits[0]
        rules = WhisperTimeStampLogitsProcessor(config, begin_index=len(prompt) - 1)
        for k, t in enumerate(ids):
            n = len(prompt) + k  # the history before token t
            if rules(seq[:, :n], logits[n - 1][None].clone())[0, t] == float("-inf"):
                broken.append(key)
                break
    assert broken, "no case breaks a timestamp rule without the processor: the test would not show it matters"
    assert all(off[key] != hf_reference[key][0] for key in broken)


def test_folder_offers_timestamps_from_its_generation_config(whisper_dir, tmp_path):
    """The route's cue (info's ``timestamps``) and the processor's tokens both come from the folder's
    generation_config; a folder without ``no_timestamps_token_id`` gets neither (the processor stays off)."""
    from transformers import WhisperTokenizer

    from omnistage.models.shared.whisper import TIMESTAMP_RULES
    from omnistage.models.shared.whisper.timestamps import WhisperTimestampRules
    from omnistage.models.whisper import WHISPER, folder_info

    tok = WhisperTokenizer.from_pretrained(whisper_dir)
    spec = folder_info(whisper_dir, WHISPER.info).transcription.timestamps
    assert spec == {
        "timestamp_begin": tok.convert_tokens_to_ids("<|0.00|>"),
        "seconds_per_timestamp": 0.02,
        "tokenizer": str(whisper_dir),
    }
    assert WHISPER.stages[0].deploy_defaults["engine_args"]["logits_processors"] == [TIMESTAMP_RULES]
    module, name = TIMESTAMP_RULES.split(":")  # vLLM's "<module>:<class>" form
    assert getattr(__import__(module, fromlist=[name]), name) is WhisperTimestampRules
    (tmp_path / "generation_config.json").write_text('{"decoder_start_token_id": 1, "eos_token_id": 0}')
    assert folder_info(tmp_path, WHISPER.info).transcription.timestamps is None
    assert TimestampTokens.from_generation_config({"eos_token_id": 0}) is None
