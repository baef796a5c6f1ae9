"""Orchestrator behaviour on small pipelines of real torch modules."""

import asyncio
import time

import pytest
import torch

from omnistage import AsyncOmni, InvalidRequestError, LLMSamplingParams, StageFailedError
from omnistage.pipeline import Edge, StageContext
from omnistage.testing import pipelines as tp
from omnistage.testing.streams import all_outputs, finished_by_stage


def _ctx(spec):
    from omnistage.config.schema import StageDeployConfig

    return StageContext(spec=spec, deploy=StageDeployConfig(stage_id=spec.stage_id), model=None)


def reference_chain(prompt: str) -> torch.Tensor:
    """The same modules, called directly."""
    p = tp.chain()
    embed = tp.TextEmbedAdapter(_ctx(p.stage(0)))
    l1, l2 = tp.LinearAdapter(_ctx(p.stage(1))), tp.LinearAdapter(_ctx(p.stage(2)))
    with torch.no_grad():
        return l2.linear(l1.linear(embed.encode(prompt)[None]))


async def test_linear_chain_matches_direct_calls_and_batches():
    async with AsyncOmni(pipeline=tp.chain()) as engine:
        prompts = [f"prompt number {i}" for i in range(6)]
        start = time.monotonic()
        results = await asyncio.gather(*(all_outputs(engine.generate(p)) for p in prompts))
        elapsed = time.monotonic() - start
        for p, outs in zip(prompts, results):
            assert outs[-1].finished and outs[-1].stage_id == 2
            torch.testing.assert_close(outs[-1].latents, reference_chain(p), rtol=0, atol=1e-6)
            assert set(outs[-1].metrics) == {0, 1, 2}
            m = outs[-1].metrics[1]  # stage 1's own clock: it ran, within the request's lifetime
            assert m["run_time_s"] > 0 and m["queue_time_s"] + m["run_time_s"] <= elapsed
        # Concurrent requests shared forwards in stage 1.
        linear = engine.replicas(1)[0].adapter
        assert max(linear.batch_sizes) > 1


async def test_fan_out_returns_both_finals_and_modalities_filter_skips_stages():
    async with AsyncOmni(pipeline=tp.fan_out()) as engine:
        outs = await all_outputs(engine.generate("hello"))
        finals = finished_by_stage(outs)
        assert set(finals) == {1, 2}
        assert finals[2].text is not None and finals[1].latents is not None
        assert finals[2].latents is None  # text stage returns text only

        outs = await all_outputs(engine.generate("hello", output_modalities=["text"]))
        assert {o.stage_id for o in outs} == {2}  # the latent-only stage 1 never ran
        assert set(outs[-1].metrics) == {0, 2}

        with pytest.raises(InvalidRequestError, match="does not produce audio"):
            await all_outputs(engine.generate("hello", output_modalities=["audio"]))
        with pytest.raises(InvalidRequestError, match="invalid output type 'Text'"):
            await all_outputs(engine.generate("hello", output_modalities=["Text"]))


async def test_fan_in_waits_for_all_sources():
    p = tp.fan_in()
    async with AsyncOmni(pipeline=p) as engine:
        outs = await all_outputs(engine.generate("fan in"))
    embed = tp.TextEmbedAdapter(_ctx(p.stage(0)))
    lin = tp.LinearAdapter(_ctx(p.stage(1)))
    summ = tp.SumAdapter(_ctx(p.stage(2)))
    with torch.no_grad():
        a = embed.encode("fan in")[None]
        expected = summ.linear(a + lin.linear(a))
    torch.testing.assert_close(outs[-1].latents, expected, rtol=0, atol=1e-6)


async def test_streaming_edge_feeds_chunks_and_finishes_only_after_upstream():
    rid = "stream-hold"
    tp.HOLD[rid] = asyncio.Event()
    try:
        async with AsyncOmni(pipeline=tp.streaming()) as engine:
            seen = []

            async def consume():
                async for o in engine.generate(
                    "abc", request_id=rid, sampling_params_list=[{"max_tokens": 6, "extra_args": {"delay": 0.01}}]
                ):
                    seen.append(o)

            def consumer_deltas() -> list:
                return [o.delta["latent"] for o in seen if o.stage_id == 1 and "latent" in o.delta]

            task = asyncio.create_task(consume())
            # Wait until the consumer has computed every token the producer emitted.
            for _ in range(500):
                if sum(d.shape[0] for d in consumer_deltas()) == 6:
                    break
                await asyncio.sleep(0.01)
            assert sum(d.shape[0] for d in consumer_deltas()) == 6, "consumer did not receive chunks while producer ran"
            # Several chunk deliveries happened before the producer finished: it really streamed.
            assert len(consumer_deltas()) >= 3
            await asyncio.sleep(0.2)
            assert not any(o.finished for o in seen), "a stage finished before the upstream stream ended"
            tp.HOLD[rid].set()
            await asyncio.wait_for(task, 10)
    finally:
        tp.HOLD.pop(rid, None)
    finals = finished_by_stage(seen)
    assert set(finals) == {0, 1}
    producer = tp.TokenStreamEngine(_ctx(tp.streaming().stage(0)))
    ids = producer.reference(3, 6)
    assert finals[0].token_ids == ids
    consumer = tp.TokenEmbedAdapter(_ctx(tp.streaming().stage(1)))
    with torch.no_grad():
        torch.testing.assert_close(finals[1].latents, consumer.embed(torch.tensor(ids)), rtol=0, atol=0)
    # the streamed deltas are exactly the pieces of the whole (assembled once, at the end)
    torch.testing.assert_close(torch.cat(consumer_deltas()), finals[1].latents, rtol=0, atol=0)


async def test_streaming_off_hands_over_whole_output():
    async with AsyncOmni(pipeline=tp.streaming(), deploy_config={"async_chunk": False}) as engine:
        outs = await all_outputs(engine.generate("abc", sampling_params_list=[{"max_tokens": 3}]))
        deltas = [o.delta["latent"] for o in outs if o.stage_id == 1 and "latent" in o.delta]
        assert len(deltas) == 1 and deltas[0].shape[0] == 3  # one delta with the whole input


async def test_abort_mid_flight_reaches_every_stage():
    async with AsyncOmni(pipeline=tp.streaming()) as engine:
        rid = "to-abort"
        tp.HOLD[rid] = asyncio.Event()  # never set: only abort can end it
        try:
            outs = []

            async def consume():
                async for o in engine.generate("x", request_id=rid, sampling_params_list=[{"max_tokens": 4}]):
                    outs.append(o)

            task = asyncio.create_task(consume())
            while not outs:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert rid in engine.running_requests(0) and rid in engine.running_requests(1)
            await engine.abort(rid)
            await asyncio.wait_for(task, 5)
            assert rid not in engine.running_requests(0) and rid not in engine.running_requests(1)
            assert engine.running_requests() == []
            # The engine keeps serving.
            good = await all_outputs(engine.generate("y", sampling_params_list=[{"max_tokens": 2}]))
            assert good[-1].finished
        finally:
            tp.HOLD.pop(rid, None)


async def test_failing_stage_fails_only_that_request():
    async with AsyncOmni(pipeline=tp.chain()) as engine:

        async def run(p):
            try:
                return await all_outputs(engine.generate(p))
            except Exception as e:  # noqa: BLE001
                return e

        results = await asyncio.gather(run("fine 1"), run("boom"), run("fine 2"))
        assert isinstance(results[1], StageFailedError) and "stage 0" in str(results[1]) and "boom" in str(results[1])
        assert results[0][-1].finished and results[2][-1].finished
        assert engine.is_ready
        with pytest.raises(InvalidRequestError, match="prompt"):
            await all_outputs(engine.generate({"prompt": 5}))


async def test_bad_input_in_a_stage_is_an_invalid_request():
    async with AsyncOmni(pipeline=tp.streaming()) as engine:
        with pytest.raises(InvalidRequestError, match="max_tokens"):
            await all_outputs(engine.generate("x", sampling_params_list=[{"max_tokens": 0}]))
        with pytest.raises(InvalidRequestError, match="sampling_params_list"):
            await all_outputs(engine.generate("x", sampling_params_list=[{}, {}, {}]))


async def test_partial_params_merge_over_stage_defaults():
    p = tp.streaming()
    p.stages[0].default_params = {"max_tokens": 3, "extra_args": {"delay": 0.0}}
    engine = AsyncOmni(
        pipeline=p, deploy_config={"stages": [{"stage_id": 0, "default_sampling_params": {"max_tokens": 4}}]}
    )
    assert engine.default_sampling_params_list[0] == {"max_tokens": 4, "extra_args": {"delay": 0.0}}
    req = engine.make_request("x", sampling_params_list=[{"extra_args": {"delay": 0.5}}])
    assert req.sampling_params[0] == LLMSamplingParams(max_tokens=4, extra_args={"delay": 0.5})


def _refuse_odd_requests(delta, request, state):
    """A streaming edge that finds some requests themselves at fault (as codec_tts does for a model that ends
    before its first frame)."""
    if "odd" in (request.text or ""):
        raise InvalidRequestError("input", "this input gives the next stage nothing to work on")
    return tp.token_chunks_every_2(delta, request, state)


async def test_a_streaming_edge_refusing_a_request_is_an_invalid_request_for_it_only():
    p = tp.streaming()
    p.stages[1].inputs = [Edge(0, process=tp.tokens_whole, process_chunk=_refuse_odd_requests)]
    async with AsyncOmni(pipeline=p) as engine:

        async def run(prompt):
            try:
                return await all_outputs(engine.generate(prompt, sampling_params_list=[{"max_tokens": 4}]))
            except Exception as e:  # noqa: BLE001
                return e

        fine, odd = await asyncio.gather(run("even"), run("odd one"))
        assert isinstance(odd, InvalidRequestError) and odd.field == "input" and "edge 0->1" in str(odd)
        assert fine[-1].finished and engine.is_ready
