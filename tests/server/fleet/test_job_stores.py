"""The job store's contract, the same on SQLite and on a real Redis server: conditional writes by the job's
runner, leases that a runner renews and loses, and the claim of an expired job that exactly one front-end wins."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import time

import pytest

from omnistage.server.jobs import StoreUnavailable
from omnistage.server.jobstore import job_store
from tests.server.fleet.stores import needs_redis

BACKENDS = ["sqlite", pytest.param("redis", marks=needs_redis)]


@pytest.fixture(params=BACKENDS)
async def store(request, tmp_path):
    if request.param == "sqlite":
        s = job_store(f"sqlite:///{tmp_path}/jobs.db")
    else:
        server = request.getfixturevalue("redis_server")
        s = job_store(server.url)
    await s.open()
    if request.param == "redis":
        await s.client.flushdb()  # (one server for the module: each test starts from an empty store)
    yield s
    await s.close()


def rec(job_id: str, status: str = "queued", **kw) -> dict:
    return {"id": job_id, "status": status, "model": "m", **kw}


async def test_rows_are_listed_in_creation_order_and_replaced_whole(store):
    await store.put("video", "b", "queued", 2, rec("b"), owner="A", lease_until=time.time() + 30, request={"p": 1})
    await store.put("video", "a", "completed", 1, rec("a", "completed"), "a.mp4")
    await store.put("voice", "v", "ready", 0, {"id": "v"})
    assert [r["id"] for r in await store.load("video")] == ["a", "b"]
    assert await store.get("b") == rec("b") and await store.get("nope") is None
    assert [r["id"] for r, _ in await store.running("video")] == ["b"]
    await store.delete("b", "v")
    assert [r["id"] for r in await store.load("video")] == ["a"] and await store.load("voice") == []
    assert await store.running("video") == []


async def test_only_the_owner_writes_and_a_deleted_job_is_never_written_back(store):
    await store.put("video", "j", "queued", 1, rec("j"), owner="A", lease_until=time.time() + 30)
    assert not await store.update("j", "B", "failed", rec("j", "failed"))
    assert await store.update("j", "A", "in_progress", rec("j", "in_progress", progress=50))
    assert (await store.get("j"))["progress"] == 50
    assert await store.update("j", "A", "completed", rec("j", "completed"), "j.mp4")
    assert await store.running("video") == []  # finished: no longer up for taking
    await store.delete("j")
    assert not await store.update("j", "A", "completed", rec("j", "completed"))
    assert await store.get("j") is None


async def test_renew_tells_the_runner_which_jobs_it_lost(store):
    now = time.time()
    for job_id in ("kept", "deleted", "taken"):
        await store.put("video", job_id, "in_progress", 1, rec(job_id), owner="A", lease_until=now - 1)
    await store.delete("deleted")
    assert await store.claim("taken", "B", time.time(), time.time() + 30) is not None
    assert await store.renew("A", ["kept", "deleted", "taken"], time.time() + 30) == {"deleted", "taken"}
    assert await store.expired("video", time.time()) == []  # kept and taken: both leased again


async def test_an_expired_job_is_claimed_by_exactly_one_front_end(store):
    now = time.time()
    await store.put("video", "live", "in_progress", 1, rec("live"), owner="A", lease_until=now + 30)
    await store.put("video", "dead", "in_progress", 2, rec("dead"), owner="A", lease_until=now - 1, request={"x": 1})
    await store.put("video", "done", "completed", 3, rec("done", "completed"), owner="A", lease_until=now - 1)
    assert [r["id"] for r in await store.expired("video", time.time())] == ["dead"]
    assert await store.claim("live", "B", time.time(), time.time() + 30) is None  # its lease holds
    assert await store.claim("done", "B", time.time(), time.time() + 30) is None  # finished
    until = time.time() + 30
    wins = await asyncio.gather(*(store.claim("dead", f"F{i}", time.time(), until) for i in range(8)))
    winners = [c for c in wins if c is not None]
    assert len(winners) == 1 and winners[0].request == {"x": 1} and winners[0].attempts == 1
    assert winners[0].record == rec("dead")
    assert await store.expired("video", time.time()) == []


async def test_a_released_job_is_queued_unowned_and_taken_without_costing_an_attempt(store):
    """(What a front-end that stops gracefully does with the jobs it has not finished.)"""
    until = time.time() + 30
    await store.put("video", "j", "in_progress", 1, rec("j", "in_progress"), owner="A", lease_until=until, request={})
    assert await store.release("j", "B", rec("j")) is False  # only its runner hands it over
    assert await store.expired("video", time.time()) == []  # A's lease still holds
    assert await store.release("j", "A", rec("j", progress=0)) is True
    assert await store.get("j") == rec("j", progress=0)
    assert [r["id"] for r, until in await store.running("video") if until is None] == ["j"]  # no lease: up now
    assert await store.renew("A", ["j"], time.time() + 30) == {"j"}  # and A no longer holds it
    claimed = await store.claim("j", "B", time.time(), time.time() + 30)
    assert claimed is not None and claimed.attempts == 0  # handed over, not taken from a dead front-end
    assert await store.claim("j", "C", time.time(), time.time() + 30) is None
    assert await store.update("j", "B", "completed", rec("j", "completed")) is True


async def test_a_row_without_a_lease_is_up_for_taking(store):
    """(A row written before leases existed, or by a front-end that died before leasing it.)"""
    await store.put("video", "old", "in_progress", 1, rec("old"))
    assert [r["id"] for r in await store.expired("video", time.time())] == ["old"]
    claimed = await store.claim("old", "B", time.time(), time.time() + 30)
    assert claimed is not None and claimed.request is None


@needs_redis
async def test_an_unreachable_redis_names_its_url():
    from omnistage.testing.server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreUnavailable, match=url.replace("/", "\\/")):
        await job_store(url).open()


def test_an_unknown_url_is_refused_naming_it():
    with pytest.raises(ValueError, match="mongodb://x"):
        job_store("mongodb://x")


def _claim_in_a_process(url: str, owner: str, start_at: float, wins) -> None:
    async def main() -> None:
        store = job_store(url)
        await store.open()
        while time.time() < start_at:  # every process claims at the same moment
            await asyncio.sleep(0.001)
        if await store.claim("dead", owner, time.time(), time.time() + 30) is not None:
            wins.put(owner)
        await store.close()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_front_end_processes_racing_for_a_job_one_gets_it(backend, tmp_path, request):
    """Separate processes, each with its own connection (on SQLite, its own file handle and locks)."""
    url = f"sqlite:///{tmp_path}/jobs.db" if backend == "sqlite" else request.getfixturevalue("redis_server").url

    async def setup() -> None:
        store = job_store(url)
        await store.open()
        await store.delete("dead")
        await store.put("video", "dead", "in_progress", 1, rec("dead"), owner="A", lease_until=time.time() - 1)
        await store.close()

    asyncio.run(setup())
    ctx = multiprocessing.get_context("spawn")
    wins = ctx.Queue()
    start_at = time.time() + 4  # (spawned interpreters take a moment to import)
    procs = [ctx.Process(target=_claim_in_a_process, args=(url, f"F{i}", start_at, wins)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    winners = []
    with contextlib.suppress(queue.Empty):
        while True:
            winners.append(wins.get(timeout=2))
    assert len(winners) == 1, winners
