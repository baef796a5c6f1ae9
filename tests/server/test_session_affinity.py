"""Session affinity through the server: a chat's turns naming one ``prompt_cache_key``, and a realtime session's
responses, go to the replica of each stage that served the session before (its state is there), while requests
naming no session take the replicas in turn. The stage here keeps per-session state itself: it answers with the
number of turns of the request's session it has served. The same on a multi-node Ray cluster:
tests/engine/test_ray_nodes.py."""

from __future__ import annotations

import asyncio

import openai
import pytest

from omnistage import AsyncOmni
from omnistage.pipeline import Pipeline, StageSpec
from omnistage.stages.base import StageOutput, StageRequest, StageStats
from tests.server.pipelines import WordEngine, prompt_text
from tests.server.realtime.helpers import user_text
from tests.server.realtime_client import openai_client, read_reply


class TurnCounter(WordEngine):
    """Replies ``turn N``: the N-th request of its session this replica serves. The prompt ``fall ill`` makes
    it report itself unhealthy from then on (as a replica whose engine died does while it restarts)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.turns: dict[str | None, int] = {}
        self.ill = False

    def stats(self) -> StageStats:
        return StageStats(healthy=not self.ill, detail="ill" if self.ill else "")

    async def generate(self, req: StageRequest):
        self.ill = self.ill or prompt_text(req.inputs) == "fall ill"
        self.turns[req.session_id] = self.turns.get(req.session_id, 0) + 1
        yield StageOutput(req.request_id, self.stage_id, {"text": f"turn {self.turns[req.session_id]}"}, False)
        yield StageOutput(req.request_id, self.stage_id, {}, True, finish_reason="stop")


def two_replicas(server_factory):
    pipeline = Pipeline("test_turns", [StageSpec(0, kind="llm", engine=TurnCounter, output="text", final=True)])
    deploy = {"stages": [{"stage_id": 0, "num_replicas": 2}]}
    return server_factory(AsyncOmni(pipeline=pipeline, deploy_config=deploy))


@pytest.fixture(scope="module")
def srv(server_factory):
    return two_replicas(server_factory)


def chat(srv):
    """A chat turn through the official client, with or without a ``prompt_cache_key``."""
    oai = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)

    def turn(key=None, text="hi"):
        kw = {"prompt_cache_key": key} if key else {}
        reply = oai.chat.completions.create(model="test_turns", messages=[{"role": "user", "content": text}], **kw)
        return reply.choices[0].message.content

    return turn


def test_a_chats_turns_with_one_prompt_cache_key_reach_the_same_replica(srv):
    turn = chat(srv)

    got: dict[str, list[str]] = {"a": [], "b": [], "c": []}  # a and c start on one replica, b on the other
    for _ in range(3):
        for key in got:
            got[key].append(turn(key))
    assert got == {k: ["turn 1", "turn 2", "turn 3"] for k in got}
    # no key: the replicas in turn, each counting the keyless requests it served
    assert [turn() for _ in range(4)] == ["turn 1", "turn 1", "turn 2", "turn 2"]


@pytest.mark.asyncio
async def test_a_realtime_sessions_responses_reach_the_same_replica(srv):
    async def session(turns: int) -> list[str]:
        async with openai_client(srv.url, "unused").realtime.connect(model="test_turns") as conn:
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            out = []
            for _ in range(turns):
                await conn.conversation.item.create(item=user_text("hi"))
                await conn.response.create()
                out.append((await read_reply(conn)).text)
            return out

    # two sessions at once: each keeps its replica (without affinity they would share both and skip counts)
    assert await asyncio.gather(session(3), session(3)) == [["turn 1", "turn 2", "turn 3"]] * 2


def test_a_session_whose_replica_is_down_moves_to_a_healthy_one(server_factory):
    turn = chat(two_replicas(server_factory))
    assert [turn("a"), turn("b"), turn("a")] == ["turn 1", "turn 1", "turn 2"]  # a on one replica, b on the other
    assert turn("a", "fall ill") == "turn 3"  # a's replica is down from now on
    assert [turn("a"), turn("a")] == ["turn 1", "turn 2"]  # taken over by b's replica, which then keeps it
    assert turn("b") == "turn 2"
    assert [turn() for _ in range(3)] == ["turn 1", "turn 2", "turn 3"]  # no session: only the healthy replica
