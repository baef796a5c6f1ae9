"""Job stores by URL (``--job-store``): ``sqlite:///path`` (the default, one machine) or
``redis://host:port/db`` (a fleet). The interface is ``omnistage.server.jobs.JobStore``."""

from __future__ import annotations

from urllib.parse import urlsplit

from omnistage.server.jobs import JobStore


def job_store(url: str) -> JobStore:
    """The store ``url`` names (not yet opened); ``ValueError`` for a URL no store takes."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from omnistage.server.jobstore.sqlite_store import SqliteJobStore

        path = url.removeprefix("sqlite://")  # sqlite:///abs/path -> /abs/path
        if not path or path == "/":
            raise ValueError(f"--job-store {url!r}: name the database file, e.g. sqlite:///var/lib/omnistage/jobs.db")
        return SqliteJobStore(path)
    if scheme in ("redis", "rediss", "unix"):
        from omnistage.server.jobstore.redis_store import RedisJobStore

        return RedisJobStore(url)
    raise ValueError(f"--job-store {url!r}: expected sqlite:///path or redis://host:port/db")
