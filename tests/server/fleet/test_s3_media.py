"""The media store on an S3-compatible server (moto's server mode, started by the test): outputs are objects
there, ``/content`` can redirect to a URL presigned for the deploy's time, and retention deletes expired
objects with their jobs."""

from __future__ import annotations

import time

import httpx
import pytest

from omnistage.config.settings import ServerSettings
from omnistage.testing.server import serve_engine
from tests.server.conftest import new_engine
from tests.server.fleet.stores import S3Server
from tests.server.pipelines import GATE, omni_pipeline

VIDEO = {"prompt": "a cat", "size": "16x16", "num_frames": 3, "seed": 1}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3")).start("media")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _s3_env(s3, monkeypatch):
    for key, value in s3.env().items():
        monkeypatch.setenv(key, value)
    GATE.set()


def serve(tmp_path, prefix: str, **settings):
    settings = ServerSettings(
        storage={"path": str(tmp_path / "unused"), **settings.pop("storage", {})},
        job_store=f"sqlite:///{tmp_path}/jobs.db",
        media_store=f"s3://media/{prefix}",
        **settings,
    )
    return serve_engine(new_engine(omni_pipeline()), settings, served_model_name="omni")


def completed(c: httpx.Client, job_id: str) -> dict:
    deadline = time.monotonic() + 30
    while (job := c.get(f"/v1/videos/{job_id}").json())["status"] != "completed":
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    return job


def keys(s3: S3Server, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.client().list_objects_v2(Bucket="media", Prefix=prefix).get("Contents", [])]


def test_content_redirects_to_a_presigned_url_of_the_object(s3, tmp_path):
    with serve(tmp_path, "signed", presign_s=120) as srv:
        c = srv.client()
        job = c.post("/v1/videos", json=VIDEO).json()
        completed(c, job["id"])
        assert keys(s3, "signed/") == [f"signed/{job['id']}.mp4"]
        stored = s3.client().get_object(Bucket="media", Key=f"signed/{job['id']}.mp4")["Body"].read()
        answer = c.get(f"/v1/videos/{job['id']}/content")
        assert answer.status_code == 307
        target = answer.headers["location"]
        assert target.startswith(s3.endpoint) and "Signature=" in target and "Expires=" in target
        assert httpx.get(target).content == stored and stored[4:8] == b"ftyp"  # no credentials needed
        assert c.delete(f"/v1/videos/{job['id']}").status_code == 200
        assert keys(s3, "signed/") == []
    assert not (tmp_path / "unused").exists() or not any((tmp_path / "unused").glob("*.mp4"))


def test_retention_deletes_expired_objects_with_their_jobs(s3, tmp_path):
    with serve(tmp_path, "kept", storage={"file_ttl": 1, "ttl_sweep_interval": 1}) as srv:
        c = srv.client()
        job = c.post("/v1/videos", json=VIDEO).json()
        assert completed(c, job["id"])["expires_at"] is not None
        deadline = time.monotonic() + 30
        while c.get(f"/v1/videos/{job['id']}").status_code != 404:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert keys(s3, "kept/") == []
