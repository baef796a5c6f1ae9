"""Two real `omnistage serve` processes on the tiny Wan model sharing one job store and one media store, as a
fleet behind a load balancer runs them: SQLite + a folder (one machine), then a real Redis server + moto's S3
server (many machines). A video job made on front-end A is polled, listed, fetched and deleted on B, after
which A answers 404 too; the outputs are objects on the S3 server; a front-end killed with SIGKILL mid-job
leaves the job to the other, which runs it again from the stored request once the lease has expired; one
stopped with SIGTERM hands its job over, and the other runs it at once. The one-machine pair takes its stores
from the deploy file (``server:``), the fleet pair from flags."""

from __future__ import annotations

import io
import signal
import threading
import time

import httpx
import pytest
import yaml

from omnistage.testing.server import ServeProcess
from tests.server.fleet.stores import RedisServer, S3Server, needs_redis

pytestmark = pytest.mark.slow  # real server processes: ~30 s to start a pair

JOB = {"prompt": "a red cat", "size": "48x32", "num_frames": 5, "num_inference_steps": 2, "seed": 4}
LEASE_S = "2"  # a killed front-end's job is taken over this long after its last renewal


def launch_pair(
    folder, logs, store_args: list[str], env: dict[str, str] | None = None, lease: str | None = LEASE_S
) -> list[ServeProcess]:
    """A and B, started side by side (each start is mostly imports and the model load); ``lease``: the job lease
    in seconds (None: as the deploy file or the default says)."""
    env = {**({"OMNISTAGE_SERVER_JOB_LEASE_S": lease} if lease else {}), **(env or {})}
    args = [str(folder), "--served-model-name", "tiny-wan", *store_args]
    out: dict[str, ServeProcess | BaseException] = {}

    def start(name: str) -> None:
        try:
            out[name] = ServeProcess.launch(args, logs / f"{name}.log", env=env)
        except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
            out[name] = e

    threads = [threading.Thread(target=start, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [v for v in out.values() if isinstance(v, BaseException)]
    if failed:
        for v in out.values():
            if isinstance(v, ServeProcess):
                v.proc.kill()
        raise failed[0]
    return [out["a"], out["b"]]


def wait_job(url: str, job_id: str, until, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = httpx.get(f"{url}/v1/videos/{job_id}", timeout=10).json()
        if until(job):
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.1)


def frames_of(data: bytes) -> tuple[int, int, int]:
    import av

    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])]
    return len(frames), *frames[0].shape[:2]


def made_on_a_served_by_b(a: ServeProcess, b: ServeProcess) -> tuple[str, bytes]:
    """The job's whole life on B; returns its id and its MP4 as B served it."""
    made = httpx.post(f"{a.url}/v1/videos", json=JOB, timeout=60)
    assert made.status_code == 200, made.text
    job = made.json()
    done = wait_job(b.url, job["id"], lambda j: j["status"] in ("completed", "failed"))
    assert done["status"] == "completed" and done["model"] == "tiny-wan", done
    content = httpx.get(f"{b.url}/v1/videos/{job['id']}/content", timeout=60, follow_redirects=True)
    assert content.status_code == 200 and frames_of(content.content) == (5, 32, 48)
    assert job["id"] in [j["id"] for j in httpx.get(f"{b.url}/v1/videos", timeout=10).json()["data"]]
    return job["id"], content.content


def deleted_on_b(a: ServeProcess, b: ServeProcess, job_id: str) -> None:
    assert httpx.delete(f"{b.url}/v1/videos/{job_id}", timeout=30).json()["deleted"] is True
    for srv in (a, b):
        assert httpx.get(f"{srv.url}/v1/videos/{job_id}", timeout=10).status_code == 404
        assert httpx.get(f"{srv.url}/v1/videos/{job_id}/content", timeout=10).status_code == 404
        assert job_id not in [j["id"] for j in httpx.get(f"{srv.url}/v1/videos", timeout=10).json()["data"]]


def test_one_machine_sqlite_and_a_folder_from_the_deploy_file(tiny_model, tmp_path):
    """The stores named in the deploy file alone; a front-end stopped with SIGTERM mid-job hands the job back
    and the other runs it at once, long before the 60 s lease a crashed front-end's job waits for."""
    deploy = tmp_path / "fleet.yaml"
    server = {
        "job_store": f"sqlite:///{tmp_path}/jobs.db",
        "media_store": f"file://{tmp_path}/media",
        "job_lease_s": 60,
    }
    deploy.write_text(yaml.safe_dump({"server": server}))
    args = ["--deploy-config", str(deploy), "--shutdown-timeout", "0", "--max-inference-steps", "1000"]
    a, b = launch_pair(tiny_model("wan"), tmp_path, args, lease=None)
    try:
        job_id, content = made_on_a_served_by_b(a, b)
        assert (tmp_path / "media" / f"{job_id}.mp4").read_bytes() == content
        assert (tmp_path / "jobs.db").is_file()
        deleted_on_b(a, b, job_id)
        assert not (tmp_path / "media" / f"{job_id}.mp4").exists()

        # 1000 steps (the server's limit raised for it): seconds of work, so the job is still running when A takes
        # the signal even on a loaded machine (at 20 steps it once finished on A before the signal landed)
        long = httpx.post(f"{a.url}/v1/videos", json={**JOB, "num_inference_steps": 1000, "seed": 6}, timeout=60)
        assert long.status_code == 200, long.text
        long_id = long.json()["id"]
        wait_job(b.url, long_id, lambda j: j["status"] == "in_progress", timeout=60)
        a.proc.send_signal(signal.SIGTERM)  # --shutdown-timeout 0: the job cannot finish on A
        assert a.proc.wait(60) in (0, -signal.SIGTERM)  # (uvicorn re-raises the signal after a clean stop)
        assert f"job {long_id}: handed over to the other front-ends" in a.log.read_text()
        # queued again by A; B looks every second, so it runs it well within the lease (a deadline, not a timing)
        taken = wait_job(b.url, long_id, lambda j: j["status"] != "queued", timeout=25)
        assert taken["status"] in ("in_progress", "completed") and taken["error"] is None, taken
        assert f"job {long_id}: unowned (handed over), taken over" in b.log.read_text()
        done = wait_job(b.url, long_id, lambda j: j["status"] in ("completed", "failed"), timeout=240)
        assert done["status"] == "completed" and done["error"] is None, done
        again = httpx.get(f"{b.url}/v1/videos/{long_id}/content", timeout=60)
        assert again.status_code == 200 and frames_of(again.content) == (5, 32, 48)
    finally:
        if a.proc.poll() is None:
            a.stop()
        b.stop()


@needs_redis
def test_a_fleet_on_redis_and_s3_survives_a_front_end_killed_mid_job(tiny_model, tmp_path):
    redis_server = RedisServer(tmp_path).start()
    s3 = S3Server(tmp_path).start("fleet")
    env = {**s3.env(), "OMNISTAGE_SERVER_STORAGE__PATH": str(tmp_path / "unused")}
    a, b = launch_pair(
        tiny_model("wan"), tmp_path, ["--job-store", redis_server.url, "--media-store", "s3://fleet/v"], env
    )
    try:
        job_id, content = made_on_a_served_by_b(a, b)
        objects = s3.client().list_objects_v2(Bucket="fleet", Prefix="v/").get("Contents", [])
        assert [o["Key"] for o in objects] == [f"v/{job_id}.mp4"]
        assert s3.client().get_object(Bucket="fleet", Key=f"v/{job_id}.mp4")["Body"].read() == content
        assert not (tmp_path / "unused").exists() or not any((tmp_path / "unused").glob("*.mp4"))
        deleted_on_b(a, b, job_id)
        assert s3.client().list_objects_v2(Bucket="fleet", Prefix="v/").get("KeyCount") == 0

        # A dies mid-job: B takes the job over once A's lease has run out, and runs it again to the end
        long = httpx.post(f"{a.url}/v1/videos", json={**JOB, "num_inference_steps": 60, "seed": 5}, timeout=60)
        assert long.status_code == 200, long.text
        long_id = long.json()["id"]
        wait_job(b.url, long_id, lambda j: j["status"] == "in_progress", timeout=60)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
        done = wait_job(b.url, long_id, lambda j: j["status"] in ("completed", "failed"), timeout=240)
        assert done["status"] == "completed" and done["error"] is None, done
        again = httpx.get(f"{b.url}/v1/videos/{long_id}/content", timeout=60)
        assert again.status_code == 200 and frames_of(again.content) == (5, 32, 48)
        assert "taken over" in b.log.read_text()
    finally:
        if a.proc.poll() is None:
            a.stop()
        b.stop()
        s3.stop()
        redis_server.stop()
