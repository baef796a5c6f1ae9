"""The stores' settings from a deploy file's ``server:``: below the ``OMNISTAGE_SERVER_*`` variables, which are
below the flags; nested ``storage`` keys merge one by one. (Two real ``omnistage serve`` processes that take
their stores from a deploy file: tests/server/fleet/test_fleet_processes.py.)"""

from __future__ import annotations

import pytest

from omnistage.config import ConfigError, load_deploy_config
from omnistage.config.settings import server_settings

SERVER = {
    "job_store": "redis://redis.internal:6379/0",
    "media_store": "s3://videos/outputs",
    "job_lease_s": 12,
    "job_max_attempts": 4,
    "presign_s": 600,
    "storage": {"path": "/srv/out", "file_ttl": 86400},
}


@pytest.fixture(autouse=True)
def _no_server_variables(monkeypatch):
    import os

    for name in [n for n in os.environ if n.startswith("OMNISTAGE_SERVER_")]:
        monkeypatch.delenv(name)


def test_the_deploy_file_sets_every_store_setting():
    s = server_settings({}, load_deploy_config({"server": SERVER}).server)
    assert (s.job_store, s.media_store, s.job_lease_s, s.job_max_attempts, s.presign_s) == (
        "redis://redis.internal:6379/0",
        "s3://videos/outputs",
        12,
        4,
        600,
    )
    assert (s.storage.path, s.storage.file_ttl, s.storage.ttl_sweep_interval) == ("/srv/out", 86400, 300)


def test_a_variable_wins_over_the_file_and_a_flag_over_both(monkeypatch):
    monkeypatch.setenv("OMNISTAGE_SERVER_JOB_STORE", "sqlite:///env/jobs.db")
    monkeypatch.setenv("OMNISTAGE_SERVER_JOB_LEASE_S", "5")
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__PATH", "/env/out")
    deploy = load_deploy_config({"server": SERVER}).server
    s = server_settings({"job_store": None, "media_store": "file:///flag"}, deploy)  # (an unset flag is None)
    assert (s.job_store, s.media_store, s.job_lease_s, s.presign_s) == (
        "sqlite:///env/jobs.db",
        "file:///flag",
        5,
        600,
    )
    assert (s.storage.path, s.storage.file_ttl) == ("/env/out", 86400)  # the file's retention stays


def test_no_server_section_leaves_the_defaults():
    s = server_settings({}, load_deploy_config({}).server)
    assert s.job_store is None and s.job_lease_s == 30 and s.storage.file_ttl is None
    assert s.job_store_url().endswith("/.jobs.sqlite3")


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"job_lease": 3}, "server.job_lease: unknown key"),
        ({"job_lease_s": 0}, "server.job_lease_s: Input should be greater than 0"),
        ({"presign_s": 0}, "server.presign_s"),
        ({"storage": {"file_ttl": 0}}, "server.storage.file_ttl"),
        ({"storage": {"ttl": 5}}, "server.storage.ttl: unknown key"),
    ],
)
def test_a_bad_server_key_is_an_error_naming_it(server, message):
    with pytest.raises(ConfigError, match=message):
        load_deploy_config({"server": server})
