"""The chat family on a real vLLM engine (CPU): parity with vLLM's own
``LLM.generate``, bad inputs, abort.

One AsyncOmni engine is shared by the whole module (a vLLM engine takes tens
of seconds to start on this machine); the reference ``LLM`` outputs come from
the session fixture in conftest.py.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from omnistage import AsyncOmni
from omnistage.config.loader import ConfigError
from omnistage.pipeline import resolve_pipeline
from omnistage.testing.streams import all_outputs

from .chat_cases import ENGINE, GREEDY, MESSAGES, PROMPTS, SEEDED

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(chat_dir, reference):
    # text+token_ids so that the test can compare ids too; the family's default is text.
    engine = AsyncOmni(chat_dir, stage_overrides={"0": {"engine_output_type": "text+token_ids"}}, **ENGINE)
    await engine.start()
    yield engine
    await engine.shutdown()


def stage_engine(omni: AsyncOmni):
    return omni.replicas(0)[0]


async def run(omni: AsyncOmni, prompt, params=None, **kw):
    """The finished output and every update's delta."""
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[params] if params is not None else None, **kw))
    return outs[-1], [o.delta for o in outs]


async def test_chat_family_resolves(chat_dir):
    assert resolve_pipeline(chat_dir).name == "chat"


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
async def test_parity_with_llm_generate(omni, reference, mode):
    params = GREEDY if mode == "greedy" else SEEDED
    # All prompts in flight together: batching must not change anyone's output.
    results = await asyncio.gather(*(run(omni, p, dict(params)) for p in PROMPTS))
    for (out, deltas), (ref_ids, ref_text) in zip(results, reference[mode]):
        assert out.finished
        assert out.token_ids == ref_ids
        assert out.text == ref_text
        assert "".join(d.get("text", "") for d in deltas) == ref_text  # deltas add up to the whole
        assert out.finish_reason == "length"
        assert out.prompt_token_ids  # reported once, kept for usage
        m = out.metrics[0]
        assert m["num_tokens"] == len(ref_ids) and m["peak_memory_mb"] > 0


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
async def test_a_whole_answer_is_one_final_output_from_vllm(omni, reference, mode):
    """A request whose caller reads only the final output (``stream=False``: the server's non-streamed answers,
    offline ``Omni``) asks vLLM for the final output alone (``RequestOutputKind.FINAL_ONLY``, as vLLM's own
    ``LLM.generate`` does): one update with all the data, then the final, equal to the reference; a streamed
    request keeps one delta per token."""
    params = GREEDY if mode == "greedy" else SEEDED

    async def whole(prompt):
        req = omni.make_request(prompt, sampling_params_list=[dict(params)])
        req.stream = False
        return await all_outputs(omni.run(req))

    results = await asyncio.gather(*(whole(p) for p in PROMPTS))
    for outs, (ref_ids, ref_text) in zip(results, reference[mode]):
        assert len(outs) == 2 and not outs[0].finished and outs[1].finished
        assert outs[0].delta["token_ids"] == ref_ids and outs[0].delta["text"] == ref_text
        assert (outs[1].token_ids, outs[1].text, outs[1].finish_reason) == (ref_ids, ref_text, "length")
        assert outs[1].prompt_token_ids and outs[1].metrics[0]["num_tokens"] == len(ref_ids)
        assert outs[1].metrics[0]["run_time_s"] > 0
    _, deltas = await run(omni, PROMPTS[0], dict(params))
    assert len(deltas) > 2  # (the default: streamed, one delta per token)


async def test_seeded_params_object(omni, reference):
    """A caller's own vllm.SamplingParams works too (and is not modified)."""
    from vllm import SamplingParams

    sp = SamplingParams(**SEEDED)
    out, _ = await run(omni, PROMPTS[1], sp)
    assert (out.token_ids, out.text) == reference["seeded"][1]
    assert sp.output_kind.name == "CUMULATIVE"


async def test_chat_messages_use_template(omni, reference):
    ref_prompt, ref_ids, ref_text = reference["chat"]
    out, _ = await run(omni, {"messages": MESSAGES}, dict(GREEDY))
    assert out.prompt_token_ids == ref_prompt
    assert out.token_ids == ref_ids and out.text == ref_text


async def test_detokenize_false_gives_ids_only(omni, reference):
    out, _ = await run(omni, PROMPTS[0], dict(GREEDY, detokenize=False))
    assert out.token_ids == reference["greedy"][0][0]
    assert not out.text


async def test_stop_token_ids(omni, reference):
    ids = reference["greedy"][2][0]
    stop = ids[5]
    out, _ = await run(omni, PROMPTS[2], dict(GREEDY, stop_token_ids=[stop]))
    assert out.finish_reason == "stop"
    assert out.token_ids == ids[: ids.index(stop) + 1]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"max_tokens": 0}, r"\bmax_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": -3}, r"\bmax_tokens: Input should be greater than or equal to 1"),
        ({"temperature": -0.5}, r"\btemperature: Input should be greater than or equal to 0"),
        ({"stop_token_ids": [10**6]}, r"\bstop_token_ids: 1000000 is outside the vocabulary"),
        ({"stop_token_ids": [-1]}, r"\bstop_token_ids: -1 is outside the vocabulary"),
        ({"not_a_param": 1}, r"unknown field\(s\) not_a_param"),
        ({"n": 2}, r"\bn: "),
    ],
)
async def test_bad_params_name_the_field(omni, params, field):
    with pytest.raises(ValueError, match=field):
        await run(omni, "hello world", params)


@pytest.mark.parametrize(
    "prompt, field",
    [
        ("hello " * 600, r"\bprompt: \d+ tokens do not fit max_model_len=512"),
        ({"prompt_token_ids": [1, 2, 10**6]}, r"\bprompt_token_ids: 1000000 is outside"),
        ({"messages": [{"content": "no role"}]}, r"\bmessages\[0\]: expected an object with 'role'"),
        ({"messages": []}, r"\bmessages: expected a non-empty list"),
    ],
)
async def test_bad_prompts_name_the_field(omni, prompt, field):
    with pytest.raises(ValueError, match=field):
        await run(omni, prompt, dict(GREEDY))


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 0.0, "max_tokens": 10**6}])
async def test_max_tokens_unset_or_past_the_context_runs_to_its_end(omni, params):
    """As vllm serve runs: no max_tokens (SamplingParams' own default would stop at 16) or one past the context
    generates to the end of the context."""
    out, _ = await run(omni, PROMPTS[0], params)
    assert out.finish_reason == "length"
    assert out.num_prompt_tokens + len(out.token_ids) == ENGINE["max_model_len"]


async def test_engine_still_serves_after_bad_requests(omni, reference):
    out, _ = await run(omni, PROMPTS[3], dict(GREEDY))
    assert out.token_ids == reference["greedy"][3][0]


async def test_abort_frees_the_vllm_slot(omni):
    eng = stage_engine(omni)
    got_tokens = asyncio.Event()
    seen: list[int] = []

    async def consume():
        async for out in omni.generate(
            "hello world",
            request_id="long-1",
            sampling_params_list=[{"max_tokens": 400, "ignore_eos": True, "temperature": 0}],
        ):
            seen.extend(out.delta.get("token_ids", []))  # streamed updates carry only their new tokens
            if len(seen) >= 3:
                got_tokens.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_tokens.wait(), 120)
    assert eng.num_unfinished_in_vllm == 1
    await omni.abort("long-1")
    await asyncio.wait_for(task, 60)  # the caller's stream ends
    for _ in range(200):  # vLLM frees the request asynchronously
        if eng.num_unfinished_in_vllm == 0:
            break
        await asyncio.sleep(0.05)
    assert eng.num_unfinished_in_vllm == 0
    assert eng.stats().running == 0
    assert len(seen) < 400


async def test_unproducible_output_type_fails_at_startup(chat_dir):
    with pytest.raises(ConfigError, match="engine_output_type"):
        AsyncOmni(chat_dir, stage_overrides={"0": {"engine_output_type": "image"}})


async def test_closing_the_stream_early_frees_the_vllm_slot(omni):
    """A consumer that stops reading (e.g. a cancelled downstream) must not leave vLLM generating."""
    from omnistage.stages.base import StageRequest

    eng = stage_engine(omni)
    stream = eng.generate(
        StageRequest("early-close", {"prompt": "hello"}, {"max_tokens": 400, "ignore_eos": True, "temperature": 0})
    )
    for _ in range(3):
        out = await stream.__anext__()
        assert not out.finished
    assert eng.num_unfinished_in_vllm == 1
    await stream.aclose()
    for _ in range(200):
        if eng.num_unfinished_in_vllm == 0:
            break
        await asyncio.sleep(0.05)
    assert eng.num_unfinished_in_vllm == 0
