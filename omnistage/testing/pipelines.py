"""Small pipelines built from real torch modules, for orchestrator tests.

Module-level classes and functions only: stage declarations must pickle by
reference to run in child processes (``process: mp``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams
from omnistage.pipeline import Edge, Pipeline, StageContext, StageSpec
from omnistage.stages.base import StageMetrics, StageOutput, StageRequest, StageStats
from omnistage.stages.generation.engine import GenerationItem

DIM = 16


def _seeded(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module.eval()


class TextEmbedAdapter:
    """prompt text -> latent [DIM] (bag of byte embeddings)."""

    def __init__(self, ctx: StageContext):
        self.embed = _seeded(torch.nn.EmbeddingBag(256, DIM, mode="mean"), 0)

    def encode(self, text: str) -> torch.Tensor:
        ids = torch.tensor(list(text.encode()) or [0])
        with torch.no_grad():
            return self.embed(ids[None])[0]

    def run(self, items: list[GenerationItem]) -> list[Any]:
        out: list[Any] = []
        for it in items:
            prompt = it.inputs.get("prompt")
            if not isinstance(prompt, str):
                out.append(InvalidRequestError("prompt", "expected a string"))
            elif "boom" in prompt:
                out.append(RuntimeError(f"cannot embed {prompt!r}"))
            else:
                out.append({"latent": self.encode(prompt)[None]})
        return out


class LinearAdapter:
    """latent -> linear(latent), batched across requests."""

    def __init__(self, ctx: StageContext):
        self.linear = _seeded(torch.nn.Linear(DIM, DIM), 1 + ctx.spec.stage_id)
        self.batch_sizes: list[int] = []

    def run(self, items: list[GenerationItem]) -> list[Any]:
        self.batch_sizes.append(len(items))
        x = torch.cat([it.inputs["latent"] for it in items])
        with torch.no_grad():
            y = self.linear(x)
        return [{"latent": y[i : i + 1]} for i in range(len(items))]


class DescribeAdapter:
    """latent -> text summary (a second, different output modality)."""

    def __init__(self, ctx: StageContext):
        self.proj = _seeded(torch.nn.Linear(DIM, 1), 7)

    def run(self, items: list[GenerationItem]) -> list[Any]:
        with torch.no_grad():
            return [{"text": f"{self.proj(it.inputs['latent']).sum().item():.6f}"} for it in items]


class SumAdapter:
    """Fan-in: adds the latents of two sources."""

    def __init__(self, ctx: StageContext):
        self.linear = _seeded(torch.nn.Linear(DIM, DIM), 11)

    def run(self, items: list[GenerationItem]) -> list[Any]:
        with torch.no_grad():
            return [{"latent": self.linear(it.inputs["a"] + it.inputs["b"])} for it in items]


class TokenEmbedAdapter:
    """Streaming consumer: embeds each chunk of token ids as it arrives."""

    def __init__(self, ctx: StageContext):
        self.embed = _seeded(torch.nn.Embedding(64, DIM), 3)

    def run(self, items: list[GenerationItem]) -> list[Any]:
        with torch.no_grad():
            # (an empty chunk: the engine's closing call, when the end came after the last tokens)
            return [
                {"latent": self.embed(torch.as_tensor(it.inputs["token_ids"]))} if "token_ids" in it.inputs else {}
                for it in items
            ]


# Test hooks for the streaming producer: a request id -> event the producer waits
# on after its last token (lets a test observe "upstream not finished yet").
HOLD: dict[str, asyncio.Event] = {}


class TokenStreamEngine:
    """A tiny autoregressive producer (argmax of a linear map over an embedding),
    one token per tick, streamed as token_id deltas."""

    def __init__(self, ctx: StageContext):
        self.stage_id = ctx.spec.stage_id
        self.embed = _seeded(torch.nn.Embedding(64, DIM), 5)
        self.head = _seeded(torch.nn.Linear(DIM, 64), 6)
        self._aborted: set[str] = set()
        self._running = 0

    async def start(self) -> None:
        pass

    def reference(self, first: int, n: int) -> list[int]:
        ids, tok = [], first
        with torch.no_grad():
            for _ in range(n):
                tok = int(self.head(self.embed(torch.tensor(tok))).argmax())
                ids.append(tok)
        return ids

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        params = LLMSamplingParams.from_any(req.params)  # (a dict when it crossed a process)
        n = int(params.get("max_tokens", 8))
        delay = float((params.get("extra_args") or {}).get("delay", 0.0))  # paces the ticks (tests of timing)
        if n <= 0:
            raise InvalidRequestError("max_tokens", "must be > 0")
        start, tok = time.monotonic(), len(req.inputs.get("prompt", "")) % 64
        self._running += 1
        try:
            for _i in range(n):
                if req.request_id in self._aborted:
                    yield StageOutput(req.request_id, self.stage_id, {}, True, finish_reason="abort")
                    return
                with torch.no_grad():
                    tok = int(self.head(self.embed(torch.tensor(tok))).argmax())
                yield StageOutput(req.request_id, self.stage_id, {"token_ids": [tok]}, False)
                await asyncio.sleep(delay)
            hold = HOLD.get(req.request_id)
            if hold is not None:
                await hold.wait()
            metrics = StageMetrics(run_time_s=time.monotonic() - start, num_tokens=n)
            yield StageOutput(req.request_id, self.stage_id, {}, True, metrics=metrics, finish_reason="length")
        finally:
            self._running -= 1
            self._aborted.discard(req.request_id)

    async def feed(self, request_id: str, chunk: dict[str, Any], last: bool) -> None:
        raise ValueError("a source stage takes no streamed input")

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def shutdown(self) -> None:
        pass

    def stats(self) -> StageStats:
        return StageStats(running=self._running)


class FailingStartAdapter:
    def __init__(self, ctx: StageContext):
        raise RuntimeError("weights are corrupt")


class SlowStartEngine(TokenStreamEngine):
    """Takes seconds to start, as a model loading does: a replacement of it is observably still starting."""

    START_S = 5.0

    async def start(self) -> None:
        await asyncio.sleep(self.START_S)


class SessionTurnsEngine(TokenStreamEngine):
    """Holds per-session state, as a stage caching a conversation does: answers with the number of turns of
    the request's session this replica has served, this one included (one token)."""

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.turns: dict[str | None, int] = {}

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        self.turns[req.session_id] = self.turns.get(req.session_id, 0) + 1
        yield StageOutput(req.request_id, self.stage_id, {"token_ids": [self.turns[req.session_id]]}, False)
        yield StageOutput(req.request_id, self.stage_id, {}, True, finish_reason="stop")


def session_turns() -> Pipeline:
    return Pipeline(
        "test_session_turns",
        [StageSpec(0, kind="llm", engine=SessionTurnsEngine, output="token_ids", final=True)],
    )


# ------------------------------------------------------------------ edge processors


def latent_as(key: str):
    return _LatentAs(key)


class _LatentAs:
    """Picklable edge processor renaming the source latent."""

    def __init__(self, key: str):
        self.key = key

    def __call__(self, outputs: dict[str, Any], request: Any) -> dict[str, Any]:
        return {self.key: outputs["latent"]}


def token_chunks_every_2(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    """Forward token ids two at a time; flush the tail when the producer finishes."""
    pending = state.setdefault("pending", [])
    pending.extend(delta.get("token_ids", []))
    if len(pending) >= 2 or (state["finished"] and pending):
        chunk, state["pending"] = list(pending), []
        return {"token_ids": chunk}
    return None


def tokens_whole(outputs: dict[str, Any], request: Any) -> dict[str, Any]:
    return {"token_ids": list(outputs["token_ids"])}


# ------------------------------------------------------------------ pipelines


def chain(process: str | None = None) -> Pipeline:
    deploy = {"process": process} if process else {}
    return Pipeline(
        "test_chain",
        [
            StageSpec(0, kind="generation", adapter=TextEmbedAdapter, output="latent", deploy_defaults=deploy),
            StageSpec(
                1, kind="generation", adapter=LinearAdapter, output="latent", inputs=[Edge(0)], deploy_defaults=deploy
            ),
            StageSpec(2, kind="generation", adapter=LinearAdapter, output="latent", final=True, inputs=[Edge(1)]),
        ],
    )


def fan_out() -> Pipeline:
    return Pipeline(
        "test_fan_out",
        [
            StageSpec(0, kind="generation", adapter=TextEmbedAdapter, output="latent"),
            StageSpec(1, kind="generation", adapter=LinearAdapter, output="latent", final=True, inputs=[Edge(0)]),
            StageSpec(2, kind="generation", adapter=DescribeAdapter, output="text", final=True, inputs=[Edge(0)]),
        ],
    )


def fan_in() -> Pipeline:
    return Pipeline(
        "test_fan_in",
        [
            StageSpec(0, kind="generation", adapter=TextEmbedAdapter, output="latent"),
            StageSpec(1, kind="generation", adapter=LinearAdapter, output="latent", inputs=[Edge(0)]),
            StageSpec(
                2,
                kind="generation",
                adapter=SumAdapter,
                output="latent",
                final=True,
                inputs=[Edge(0, process=latent_as("a")), Edge(1, process=latent_as("b"))],
            ),
        ],
    )


def streaming() -> Pipeline:
    return Pipeline(
        "test_streaming",
        [
            StageSpec(0, kind="llm", engine=TokenStreamEngine, output="token_ids", final=True),
            StageSpec(
                1,
                kind="generation",
                adapter=TokenEmbedAdapter,
                output="latent",
                final=True,
                inputs=[Edge(0, process=tokens_whole, process_chunk=token_chunks_every_2)],
            ),
        ],
        default_deploy={"async_chunk": True},
    )
