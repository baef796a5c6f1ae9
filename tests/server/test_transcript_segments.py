"""server/segments.py against ``vllm serve``'s own cut (``SpeechToTextBaseServing._get_verbose_segments``,
called with the tiny Whisper's tokenizer), no engine: random windows of text, special and timestamp tokens —
pairs, a single timestamp at the end, the end token, lone timestamps inside text — give vLLM's segments (start,
end, text, tokens, avg_logprob), offset by the window's start; where vLLM gives none, the window is one segment;
times past the window's audio are held at its end."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from omnistage.server.segments import tokenizer, window_segments


@pytest.fixture(scope="module")
def tok(tiny_model):
    return tokenizer(str(tiny_model("whisper")))


def vllm_segments(tok, ids, logprobs, start):
    from vllm.entrypoints.speech_to_text.base.serving import SpeechToTextBaseServing
    from vllm.entrypoints.speech_to_text.transcription.protocol import TranscriptionSegment
    from vllm.logprobs import Logprob

    serving = SimpleNamespace(tokenizer=tok)  # the one attribute the method reads
    flat = [{t: Logprob(lp)} for t, lp in zip(ids, logprobs)]
    return SpeechToTextBaseServing._get_verbose_segments(
        serving, tuple(ids), flat, SimpleNamespace(temperature=0.0), TranscriptionSegment, start_time=start
    )


def random_window(rng, begin, eos):
    """Text (some special tokens among it) broken by timestamps that only go forward, now single, now paired."""
    ids, t = [], begin
    for _ in range(int(rng.integers(1, 6))):
        ids += [int(x) for x in rng.integers(0, begin, int(rng.integers(0, 5)))]  # (below <|0.00|>: not timestamps)
        t += int(rng.integers(1, 200))
        ids += [t] * int(rng.integers(1, 3)) if rng.random() < 0.7 else [t, t + int(rng.integers(1, 20))]
    if rng.random() < 0.3:
        ids.pop()  # an unfinished last segment
    if rng.random() < 0.5:
        ids.append(eos)
    return ids


def test_segments_equal_vllm_serves(tok):
    begin, eos = tok.convert_tokens_to_ids("<|0.00|>"), tok.eos_token_id
    spec = {"timestamp_begin": begin, "seconds_per_timestamp": 0.02}
    rng = np.random.default_rng(0)
    compared = whole = 0
    for _ in range(300):
        ids = random_window(rng, begin, eos)
        logprobs = [float(x) for x in -rng.random(len(ids)) * 5]
        start = float(rng.choice([0.0, 29.98, 59.5]))
        theirs = vllm_segments(tok, ids, logprobs, start)
        ours = window_segments(ids, logprobs, start, start + 1000.0, "all of it", spec, tok.decode, eos, seek=7)
        if not theirs:
            whole += 1
            assert [(s.start, s.end, s.text, s.tokens) for s in ours] == [(start, start + 1000.0, "all of it", ids)]
            assert ours[0].avg_logprob == pytest.approx(np.mean(logprobs))
            continue
        compared += 1
        assert [(s.start, s.end, s.text, s.tokens, s.avg_logprob, s.seek) for s in ours] == [
            (pytest.approx(s.start), pytest.approx(s.end), s.text, list(s.tokens), pytest.approx(s.avg_logprob), 7)
            for s in theirs
        ], ids
    assert compared > 100 and whole >= 5


def test_times_past_the_window_are_held_at_its_end(tok):
    begin, eos = tok.convert_tokens_to_ids("<|0.00|>"), tok.eos_token_id
    spec = {"timestamp_begin": begin, "seconds_per_timestamp": 0.02}
    ids = [5, 6, begin + 100, begin + 150, 7, begin + 400, begin + 1000, 8, begin + 1200, eos]  # 2 s, 3 s, 8 s, ...
    ours = window_segments(ids, None, 60.0, 65.0, "", spec, tok.decode, eos, seek=6000)
    assert [(s.start, s.end, s.tokens, s.avg_logprob) for s in ours] == [
        (60.0, pytest.approx(62.0), [5, 6], None),
        (pytest.approx(63.0), 65.0, [7], None),
        (65.0, 65.0, [8], None),
    ]
    theirs = vllm_segments(tok, ids, [0.0] * len(ids), 60.0)
    assert [(s.start, s.end) for s in theirs] == [
        (60.0, pytest.approx(62.0)),
        (pytest.approx(63.0), 68.0),
        (80.0, 84.0),
    ]
