"""A graceful stop whose grace runs out: ``omnistage serve``'s uvicorn server (in this process) with requests
that never finish by themselves (the test pipeline's ``block:`` prompts, its gate never opened) is stopped
as SIGTERM stops it. Each request still running when ``--shutdown-timeout`` ends is aborted and ends with a
typed 503 ``shutting_down``: a JSON error, an SSE error event once streaming, a realtime ``error`` event and a
failed ``response.done``. Deadlines here stop a hang only."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from omnistage.cli.uvicorn_server import server_class
from omnistage.config.settings import ServerSettings
from omnistage.server import ServeOptions, create_app
from omnistage.testing.server import serve_app
from tests.server.conftest import error_of, new_engine
from tests.server.pipelines import GATE, omni_pipeline
from tests.server.realtime.helpers import user_text
from tests.server.realtime_client import openai_client, read_reply

GRACE_S = 1.0
BLOCKED = {"messages": [{"role": "user", "content": "block: never finishes"}], "modalities": ["text"]}


@pytest.fixture(autouse=True)
def _gate():
    GATE.clear()  # the blocked requests outlive any grace
    yield
    GATE.set()


async def wait_for(cond, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def sse_events(url: str, started: asyncio.Event) -> list[dict]:
    events = []
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{url}/v1/chat/completions", json={**BLOCKED, "stream": True}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(json.loads(line[6:]))
                    started.set()  # the first delta is out: the stream has begun
    return events


async def test_requests_still_running_when_the_grace_ends_get_a_503_saying_so(tmp_path):
    engine = new_engine(omni_pipeline())
    app = create_app(engine, ServerSettings(storage={"path": str(tmp_path)}), ServeOptions(shutdown_grace_s=GRACE_S))
    srv = serve_app(app, engine=engine, server_class=server_class(), ready_timeout=120)
    url, state = srv.url, srv.state

    async with httpx.AsyncClient(timeout=60) as client:
        whole = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=BLOCKED))
        streamed_started = asyncio.Event()
        streamed = asyncio.create_task(sse_events(url, streamed_started))
        async with openai_client(url, "unused").realtime.connect() as conn:
            await conn.conversation.item.create(item=user_text("block: talk forever"))
            await conn.response.create()
            spoken = asyncio.create_task(read_reply(conn))
            await streamed_started.wait()
            await wait_for(lambda: state.admission.pending == 3)  # all three inside the stages

            srv.server.should_exit = True  # what SIGTERM does (uvicorn's handler)
            reply = await spoken
        r = await whole
        events = await streamed

    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    err = error_of(r)
    assert err["code"] == "shutting_down" and "--shutdown-timeout of 1 s" in err["message"], err
    assert "error" not in events[0] and events[-1]["error"]["code"] == "shutting_down", events
    assert [e.code for e in reply.errors] == ["shutting_down"]
    assert reply.status == "failed" and reply.done.response.status_details.error.code == "shutting_down"
    srv.thread.join(60)
    assert not srv.thread.is_alive() and not engine.started
