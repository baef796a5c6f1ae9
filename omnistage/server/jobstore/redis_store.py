"""The job store on Redis (``redis://host:port/db``): a fleet of front-ends on many machines.

Keys (prefix ``omnistage:``): ``job:{id}``, a hash of the row's fields; ``kind:{kind}``, a sorted set of the
kind's ids by ``created_at`` (the listing order); ``running:{kind}``, the set of its ids still queued or running.
Every write that has a condition (the runner still owns the job, the lease expired) is one Lua script, which
Redis runs atomically: of two front-ends claiming a job exactly one wins.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from omnistage.server.jobs import RUNNING, Claimed, JobStore, StoreUnavailable, parse_lease

logger = logging.getLogger(__name__)

PREFIX = "omnistage:"

# KEYS: job hash, running set; ARGV: owner, status, record, file, updated_at, job id, running statuses...
_UPDATE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'record', ARGV[3], 'file', ARGV[4], 'updated_at', ARGV[5])
local running = false
for i = 7, #ARGV do if ARGV[i] == ARGV[2] then running = true end end
if not running then redis.call('SREM', KEYS[2], ARGV[6]) end
return 1
"""
# KEYS: job hash; ARGV: owner, lease_until
_RENEW = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
return 1
"""
# KEYS: job hash; ARGV: owner, now, lease_until, running statuses...
_CLAIM = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
local running = false
for i = 4, #ARGV do if ARGV[i] == status then running = true end end
if not running then return 0 end
local lease = redis.call('HGET', KEYS[1], 'lease_until')
if lease and lease ~= '' and tonumber(lease) >= tonumber(ARGV[2]) then return 0 end
local before = redis.call('HGET', KEYS[1], 'owner')
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_until', ARGV[3])
local step = 0
if before and before ~= '' then step = 1 end
return {1, redis.call('HINCRBY', KEYS[1], 'attempts', step)}
"""
# KEYS: job hash; ARGV: owner, record, updated_at (a released job: queued, unowned, no lease)
_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'record', ARGV[2], 'updated_at', ARGV[3], 'owner', '', 'lease_until', '')
return 1
"""
# KEYS: job hash; ARGV: job id, prefix
_DELETE = """
local kind = redis.call('HGET', KEYS[1], 'kind')
redis.call('DEL', KEYS[1])
if kind then
  redis.call('ZREM', ARGV[2] .. 'kind:' .. kind, ARGV[1])
  redis.call('SREM', ARGV[2] .. 'running:' .. kind, ARGV[1])
end
return 1
"""


def _job(job_id: str) -> str:
    return f"{PREFIX}job:{job_id}"


class RedisJobStore(JobStore):
    def __init__(self, url: str):
        self.url = url
        self._client: aioredis.Redis | None = None

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise StoreUnavailable(f"the job store {self.url} is not open")
        return self._client

    async def open(self) -> None:
        # short timeouts: a store that went away must turn requests into 503s quickly, not hang them
        self._client = aioredis.from_url(self.url, socket_connect_timeout=2, socket_timeout=5)
        await self._do(self._client.ping())

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _do(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except (RedisError, OSError) as e:
            raise StoreUnavailable(f"the job store {self.url} is unreachable: {e}") from None

    async def put(
        self,
        kind: str,
        job_id: str,
        status: str,
        created_at: int,
        record: dict[str, Any],
        file: str | None = None,
        *,
        owner: str | None = None,
        lease_until: float | None = None,
        request: dict[str, Any] | None = None,
    ) -> None:
        fields = {
            "kind": kind,
            "status": status,
            "created_at": int(created_at),
            "updated_at": time.time(),
            "file": file or "",
            "record": json.dumps(record),
            "request": "" if request is None else json.dumps(request),
            "owner": owner or "",
            "lease_until": "" if lease_until is None else repr(lease_until),
            "attempts": 0,
        }
        pipe = self.client.pipeline(transaction=True)  # MULTI/EXEC: nobody sees the row half-written
        pipe.delete(_job(job_id))
        pipe.hset(_job(job_id), mapping=fields)
        pipe.zadd(f"{PREFIX}kind:{kind}", {job_id: int(created_at)})
        if status in RUNNING:
            pipe.sadd(f"{PREFIX}running:{kind}", job_id)
        else:
            pipe.srem(f"{PREFIX}running:{kind}", job_id)
        await self._do(pipe.execute())

    async def update(
        self, job_id: str, owner: str, status: str, record: dict[str, Any], file: str | None = None
    ) -> bool:
        kind = await self._do(self.client.hget(_job(job_id), "kind"))
        if kind is None:
            return False
        running_key = f"{PREFIX}running:{kind.decode()}"
        args = [owner, status, json.dumps(record), file or "", time.time(), job_id, *RUNNING]
        return bool(await self._do(self.client.eval(_UPDATE, 2, _job(job_id), running_key, *args)))

    async def get(self, job_id: str) -> dict[str, Any] | None:
        text = await self._do(self.client.hget(_job(job_id), "record"))
        return None if text is None else _decode(text, self.url)

    async def load(self, kind: str) -> list[dict[str, Any]]:
        ids = await self._do(self.client.zrange(f"{PREFIX}kind:{kind}", 0, -1))
        rows = await self._fields(ids, "record")
        return [r for (text,) in rows if text is not None and (r := _decode(text, self.url)) is not None]

    async def _fields(self, ids: list[bytes], *names: str) -> list[list[Any]]:
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(_job(job_id.decode()), list(names))
        return await self._do(pipe.execute()) if ids else []

    async def delete(self, *job_ids: str) -> None:
        for job_id in job_ids:
            await self._do(self.client.eval(_DELETE, 1, _job(job_id), job_id, PREFIX))

    async def renew(self, owner: str, job_ids: list[str], lease_until: float) -> set[str]:
        lost = set()
        for job_id in job_ids:
            if not await self._do(self.client.eval(_RENEW, 1, _job(job_id), owner, repr(lease_until))):
                lost.add(job_id)
        return lost

    async def claim(self, job_id: str, owner: str, now: float, lease_until: float) -> Claimed | None:
        won = await self._do(self.client.eval(_CLAIM, 1, _job(job_id), owner, repr(now), repr(lease_until), *RUNNING))
        if not won:
            return None
        attempts = won[1]
        record, request = await self._do(self.client.hmget(_job(job_id), ["record", "request"]))
        if record is None:  # deleted right after the claim
            return None
        return Claimed(json.loads(record), json.loads(request) if request else None, int(attempts))

    async def release(self, job_id: str, owner: str, record: dict[str, Any]) -> bool:
        script = self.client.eval(_RELEASE, 1, _job(job_id), owner, json.dumps(record), repr(time.time()))
        return bool(await self._do(script))

    async def running(self, kind: str) -> list[tuple[dict[str, Any], float | None]]:
        ids = sorted(await self._do(self.client.smembers(f"{PREFIX}running:{kind}")))
        out = []
        for text, until in await self._fields(ids, "record", "lease_until"):
            if text is not None and (record := _decode(text, self.url)) is not None:
                out.append((record, parse_lease(until)))
        return out


def _decode(text: bytes, url: str) -> dict[str, Any] | None:
    try:
        return json.loads(text)
    except json.JSONDecodeError:  # a damaged row must not stop the server
        logger.error("job store %s: skipping an unreadable row", url)
        return None
