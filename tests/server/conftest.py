"""Helpers for the route tests: servers come from the ``server_factory`` fixture (omnistage.testing.fixtures),
a real uvicorn server in a thread of the test process, so tests can look at the engine's state while
requests run."""

from __future__ import annotations

import httpx

from omnistage import AsyncOmni


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def new_engine(pipeline) -> AsyncOmni:
    return AsyncOmni(pipeline=pipeline)
