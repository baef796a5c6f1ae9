"""Async chunk from an llm producer: a real vLLM stage streams token ids every
N tokens into a test-only generation stage (a real torch embedding, batched by
the generic GenerationStageEngine) while it is still generating."""

from __future__ import annotations

import pytest
import pytest_asyncio
import torch

from omnistage import AsyncOmni
from omnistage.pipeline import Edge, Pipeline, StageContext, StageSpec
from omnistage.stages.generation.engine import GenerationItem
from omnistage.stages.llm.chunks import every_n_tokens

CHUNK = 8
MAX_TOKENS = 150  # not a multiple of CHUNK: the tail is flushed at the end
VOCAB = 384  # the tiny chat model's vocabulary


class EmbedTokens:
    """Consumer adapter: token-id chunks -> rows of a seeded embedding table."""

    seen: list[list[int]] = []  # chunk sizes per run() call, for the test

    def __init__(self, ctx: StageContext):
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(VOCAB, 4).eval()

    @torch.no_grad()
    def run(self, items: list[GenerationItem]) -> list[dict]:
        ids = [torch.tensor(it.inputs.get("token_ids", []), dtype=torch.long) for it in items]
        EmbedTokens.seen.append([len(i) for i in ids])
        rows = self.table(torch.cat(ids)).split([len(i) for i in ids])  # one batched forward
        return [{"latent": r.clone()} for r in rows]


PIPELINE = Pipeline(
    name="test_llm_chunk",
    stages=[
        StageSpec(0, kind="llm", output="token_ids", final=True),
        StageSpec(
            1,
            kind="generation",
            adapter=EmbedTokens,
            output="latent",
            final=True,
            inputs=[Edge(0, process_chunk=every_n_tokens(CHUNK))],
        ),
    ],
)


def test_every_n_tokens_flushes_the_tail():
    f, state = every_n_tokens(4), {"finished": False}
    assert f({"token_ids": [1, 2, 3]}, None, state) is None
    assert f({"token_ids": [4, 5]}, None, state) == {"token_ids": [1, 2, 3, 4]}
    assert f({"text": "x"}, None, state) is None
    state["finished"] = True
    assert f({}, None, state) == {"token_ids": [5]}
    assert f({}, None, state) is None
    with pytest.raises(ValueError):
        every_n_tokens(0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(tiny_model):
    engine = AsyncOmni(tiny_model("chat"), pipeline=PIPELINE, max_model_len=512, dtype="float32")
    await engine.start()
    yield engine
    await engine.shutdown()


@pytest.mark.vllm
@pytest.mark.asyncio(loop_scope="module")
async def test_chunks_flow_while_the_producer_generates(omni):
    EmbedTokens.seen.clear()
    events = []  # (stage, finished, produced so far) in the order the caller sees them
    final = {}
    params = [{"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}, None]
    produced = {0: 0, 1: 0}
    async for out in omni.generate("hello world", sampling_params_list=params):
        delta = out.delta.get("token_ids" if out.stage_id == 0 else "latent")
        produced[out.stage_id] += 0 if delta is None else len(delta)
        events.append((out.stage_id, out.finished, produced[out.stage_id]))
        if out.finished:
            final[out.stage_id] = out
    producer_done = events.index((0, True, MAX_TOKENS))
    consumer_first = next(i for i, e in enumerate(events) if e[0] == 1)
    consumer_done = next(i for i, e in enumerate(events) if e[0] == 1 and e[1])
    # The consumer started on chunks before the producer finished ...
    assert consumer_first < producer_done
    assert events[consumer_first][2] < MAX_TOKENS
    # ... and finished only after it, with every token consumed (tail included).
    assert consumer_done > producer_done
    ids = final[0].token_ids
    assert len(ids) == MAX_TOKENS
    table = EmbedTokens(None).table
    with torch.no_grad():
        assert torch.equal(final[1].latents, table(torch.tensor(ids)))
    chunks = [n for call in EmbedTokens.seen for n in call]
    assert sum(chunks) == MAX_TOKENS
    assert all(n % CHUNK == 0 for n in chunks[:-1])  # whole chunks until the flush
