"""What both Qwen-Omni client tests check of an answer the official client read: the same text, transcript, speech,
finish reason and usage as omnistage's own request, and the per-stage fields the talker and the codec decoder
have no use for said in warnings, not refused; ``counted``: the part of a usage two requests for the same content
share."""

from collections.abc import Callable
from typing import Any

import numpy as np


def assert_answers_as_ours(raw: Any, ours: dict, wav: Callable[[str], np.ndarray]) -> None:
    completion = raw.parse()
    expected = ours["choices"][0]["message"]
    choice = completion.choices[0]
    assert choice.message.content == expected["content"] and choice.message.content
    assert choice.message.audio.transcript == choice.message.content
    got = wav(choice.message.audio.data)
    assert got.size > 0 and np.array_equal(got, wav(expected["audio"]["data"]))  # same seed, same codes
    assert choice.finish_reason == ours["choices"][0]["finish_reason"]
    assert counted(completion.usage.model_dump(exclude_none=True)) == counted(ours["usage"])
    warnings = raw.headers.get_list("x-omnistage-warning")
    assert any(w.startswith("sampling_params_list[1]: detokenize, stop_token_ids ignored") for w in warnings)
    assert any(w.startswith("sampling_params_list[2]: detokenize, max_tokens, repetition_penalty, ") for w in warnings)


def counted(usage: dict, speech: bool = True) -> dict:
    """The usage without ``prompt_tokens_details.cached_tokens`` (checked, then left out: it counts what earlier
    requests left in vLLM's prefix cache, so the same prompt sent twice reads more of it the second time) and,
    with ``speech=False``, without ``completion_tokens_details.audio_tokens`` (the talker's codec tokens, made
    only when speech is asked)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in usage.items()}
    cached = out["prompt_tokens_details"].pop("cached_tokens")
    assert 0 <= cached <= usage["prompt_tokens"]
    if not speech:
        out["completion_tokens_details"].pop("audio_tokens")
    return out
