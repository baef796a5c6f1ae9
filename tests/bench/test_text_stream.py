"""Text-metric arithmetic on synthetic SSE chunk streams (TTFT, TPOT and inter-token latency rules)."""

import pytest

from omnistage.bench.text_stream import TextStreamTracker, reported_token_count


def chunk(content=None, role=None, usage=None, metrics=None, modality=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    c = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        c["usage"] = {"prompt_tokens": 7, "completion_tokens": usage, "total_tokens": 7 + usage}
    if metrics is not None:
        c["metrics"] = {"num_tokens": metrics}
    if modality:
        c["modality"] = modality
    return c


def run(events, start=0.0):
    tracker = TextStreamTracker(start)
    for t, c in events:
        tracker.on_chunk(t, c)
    return tracker.finish()


def test_role_chunk_then_two_single_token_chunks():
    stats = run(
        [
            (0.10, chunk(role="assistant", content="", usage=0)),
            (0.30, chunk("Hello", usage=1)),
            (0.45, chunk(" world", usage=2)),
        ]
    )
    assert stats.output_tokens == 2
    assert stats.ttft == pytest.approx(0.30)  # the empty role chunk does not count
    assert stats.itl == [pytest.approx(0.15)]
    assert stats.e2e_text - stats.ttft == pytest.approx(sum(stats.itl))
    assert stats.tpot == pytest.approx(0.15)
    assert stats.text == "Hello world"


def test_chunk_carrying_three_tokens_splits_its_interval():
    stats = run([(0.2, chunk("A", usage=1)), (0.8, chunk("BCD", usage=4))])
    assert stats.output_tokens == 4
    assert len(stats.itl) == 3
    assert stats.itl == [pytest.approx(0.2)] * 3
    assert stats.e2e_text - stats.ttft == pytest.approx(sum(stats.itl))
    assert stats.tpot == pytest.approx(0.2)


def test_usage_beats_metrics_in_the_same_chunk():
    c = chunk("x", usage=8, metrics=5)
    assert reported_token_count(c) == 8
    assert run([(0.1, c)]).output_tokens == 8


def test_metrics_used_when_no_usage():
    assert reported_token_count(chunk("x", metrics=5)) == 5
    stage_chunk = {"choices": [], "stage_metrics": {"1": {"num_tokens": 9}, "0": {"num_tokens": 6}}}
    assert reported_token_count(stage_chunk) == 6  # lowest stage id that produced tokens


def test_metrics_only_chunk_updates_the_count():
    stats = run(
        [
            (0.1, chunk("A", usage=1)),
            (0.3, chunk("B")),  # no count: the interval runs on
            (0.5, chunk("C")),
            (0.6, {"choices": [], "metrics": {"num_tokens": 3}}),  # metrics-only chunk
        ]
    )
    assert stats.output_tokens == 3
    assert stats.itl == [pytest.approx(0.2)] * 2  # (0.5 - 0.1) split over 2 tokens
    assert stats.e2e_text == pytest.approx(0.5)  # the metrics chunk is not text
    assert stats.e2e_text - stats.ttft == pytest.approx(sum(stats.itl))


def test_final_usage_chunk_after_uncounted_stream():
    # include_usage without continuous stats: only the last chunk says how many tokens.
    events = [(0.1 * i, chunk(f"t{i}")) for i in range(1, 6)]
    events.append((0.7, {"choices": [], "usage": {"completion_tokens": 9}}))
    stats = run(events)
    assert stats.output_tokens == 9  # 5 chunks, but the server says 9 tokens
    assert len(stats.itl) == 8
    assert sum(stats.itl) == pytest.approx(0.5 - 0.1)


def test_no_count_from_server_gives_no_token_timing():
    stats = run([(0.1, chunk("A")), (0.2, chunk("B"))])
    assert stats.output_tokens is None  # never guessed from chunk counts
    assert stats.itl == [] and stats.tpot is None
    assert stats.ttft == pytest.approx(0.1)


def test_chunk_without_new_tokens_merges_into_next_interval():
    stats = run(
        [
            (0.1, chunk("A", usage=1)),
            (0.2, chunk("\u00e9", usage=1)),  # text released with no new token (held-back bytes)
            (0.4, chunk("B", usage=2)),
        ]
    )
    assert stats.itl == [pytest.approx(0.3)]


def test_audio_chunks_are_not_text():
    stats = run(
        [
            (0.1, chunk("", role="assistant", usage=0)),
            (0.2, chunk("Hi", usage=1, modality="text")),
            (0.3, {"modality": "audio", "choices": [{"delta": {"audio": {"data": "AAAA"}}}]}),
        ]
    )
    assert stats.e2e_text == pytest.approx(0.2)
    assert stats.output_tokens == 1


def test_start_offset_is_subtracted():
    stats = run([(10.5, chunk("A", usage=1)), (11.0, chunk("B", usage=2))], start=10.0)
    assert stats.ttft == pytest.approx(0.5)
    assert stats.e2e_text == pytest.approx(1.0)
