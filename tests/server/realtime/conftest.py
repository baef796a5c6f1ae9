"""The servers the realtime route tests talk to: real uvicorn servers in this process serving the test omni
pipeline (a word-by-word ``llm`` stage and a streamed tone stage: tests/server/pipelines.py)."""

from __future__ import annotations

import pytest

from tests.server.conftest import new_engine
from tests.server.pipelines import GATE, omni_pipeline
from tests.server.realtime.helpers import BUFFER_S, EVENT_LIMIT, KEY


@pytest.fixture(scope="module")
def srv(server_factory):
    """With an API key, at most 2 sessions, a 64 KiB event limit and a 4 s input buffer."""
    GATE.clear()  # "block:" prompts wait until cancelled
    return server_factory(
        new_engine(omni_pipeline()),
        api_key=KEY,
        max_realtime_sessions=2,
        realtime_max_event_bytes=EVENT_LIMIT,
        realtime_max_buffer_s=BUFFER_S,
    )


@pytest.fixture(scope="module")
def short(server_factory):
    """Servers whose sessions end soon: one closes them idle after 0.5 s, one when 1 s old."""
    idle = server_factory(new_engine(omni_pipeline()), api_key=KEY, realtime_idle_timeout_s=0.5)
    brief = server_factory(new_engine(omni_pipeline()), api_key=KEY, realtime_max_session_s=1.0)
    return idle, brief
