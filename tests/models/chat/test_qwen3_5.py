"""Qwen3.5 (hybrid Gated DeltaNet / full-attention LM behind a ViT) served by the chat family on the tiny
``qwen3_5`` fixture: ``/v1/chat/completions`` through the official ``openai`` client, text alone, an image and
a video (an MP4 the server decodes), greedy answers equal to transformers' processor + ``generate`` on the same
folder and media (tests/models/chat/qwen3_5_cases.py), streamed and not, with ``usage`` counting the
prompt's image and video tokens as the reference's prompt holds them.

The server runs the model in bfloat16 (vLLM's CPU Gated DeltaNet kernel takes nothing else), the reference
in float32: each case first checks that no greedy step of the reference is a near-tie that bfloat16 rounding
could decide the other way (qwen3_5_cases.py ``MIN_MARGIN``), so equal answers are expected, not lucky."""

from __future__ import annotations

import openai
import pytest

from omnistage.pipeline import resolve_pipeline
from omnistage.testing.server import serve_engine
from tests.models.chat.mm_cases import ENGINE
from tests.models.chat.qwen3_5_cases import CASES, GREEDY, MIN_MARGIN, SERVED_DTYPE, transformers_answer


def test_the_chat_family_claims_it(tiny_model):
    assert resolve_pipeline(tiny_model("qwen3_5")).name == "chat"


@pytest.fixture(scope="module")
def qwen3_5(tiny_model):
    """(openai client, model name, transformers' answers by case); the answers first."""
    from omnistage import AsyncOmni

    folder = tiny_model("qwen3_5")
    ref = {name: transformers_answer(str(folder), messages) for name, messages in CASES.items()}
    engine = AsyncOmni(folder, limit_mm_per_prompt={"image": 1, "video": 1}, **{**ENGINE, "dtype": SERVED_DTYPE})
    with serve_engine(engine, ready_timeout=300) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)
        yield client, client.models.list().data[0].id, ref


def assert_usage(usage, answer, folder):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    ids = answer.prompt_token_ids
    assert usage.prompt_tokens == len(ids)  # image/video placeholders expanded as the processor expands them
    assert usage.completion_tokens == len(answer.token_ids)
    assert usage.total_tokens == len(ids) + len(answer.token_ids)
    details = usage.prompt_tokens_details.model_dump()
    images, videos = details["image_tokens"], details.get("video_tokens", 0)
    assert images == ids.count(config.image_token_id)
    # a video's tokens are its frames' pads and the timestamps between them: all that its placeholder became
    assert videos == (answer.media_tokens - images if config.video_token_id in ids else 0)
    assert details["text_tokens"] == len(ids) - images - videos


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_chat_equals_transformers_generate(qwen3_5, tiny_model, case):
    client, model, ref = qwen3_5
    answer = ref[case]
    assert len(answer.token_ids) == GREEDY["max_tokens"], "the fixture must answer something to compare"
    assert answer.margin > MIN_MARGIN, f"a near-tie bfloat16 may decide either way: margin {answer.margin}"
    completion = client.chat.completions.create(model=model, messages=CASES[case], **GREEDY)
    assert completion.choices[0].message.content == answer.text
    assert_usage(completion.usage, answer, tiny_model("qwen3_5"))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_streamed_equals_transformers_generate(qwen3_5, tiny_model, case):
    """``stream: true`` with ``include_usage``: the deltas join into the same answer as the whole one, with the
    same usage, and the finish reason says why it stopped."""
    client, model, ref = qwen3_5
    stream = client.chat.completions.create(
        model=model, messages=CASES[case], **GREEDY, stream=True, stream_options={"include_usage": True}
    )
    deltas, usage, finish = [], None, None
    for chunk in stream:
        deltas += [c.delta.content or "" for c in chunk.choices]
        finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
        usage = chunk.usage or usage
    assert "".join(deltas) == ref[case].text
    assert finish == ("length" if len(ref[case].token_ids) == GREEDY["max_tokens"] else "stop")
    assert_usage(usage, ref[case], tiny_model("qwen3_5"))
