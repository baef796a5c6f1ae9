"""Fixtures of the fleet tests: a Redis server for the module (started on a free port, stopped after)."""

from __future__ import annotations

import pytest

from tests.server.fleet.stores import REDIS, RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    if REDIS is None:  # (the tests that use it carry the needs_redis mark: skip, or fail in CI)
        pytest.fail("redis-server is not installed")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()
