"""Real store servers for the fleet tests, each started on a free port by the test: Debian's ``redis-server``
(scripts/install-redis.sh) and moto's S3-compatible server (``moto[server]``, a dev dependency)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from omnistage.testing.requires import requirement
from omnistage.testing.server import HOST, free_port

REDIS = shutil.which("redis-server")
needs_redis = requirement(None if REDIS else "needs redis-server on PATH (scripts/install-redis.sh; needs root)")
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _wait(check, proc: subprocess.Popen, what: str, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.1)


@dataclass
class RedisServer:
    """One ``redis-server`` with no persistence (a stop loses everything, as a crashed cache would)."""

    folder: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> RedisServer:
        log = self.folder / f"redis-{self.port}.log"
        args = [REDIS, "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, cwd=self.folder, stdout=log.open("w"), stderr=subprocess.STDOUT)
        _wait(lambda: "Ready to accept connections" in log.read_text(), self.proc, "redis-server", log)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@dataclass
class S3Server:
    """moto's server mode: an S3 endpoint on a local port, with one bucket made for the test."""

    folder: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def env(self) -> dict[str, str]:
        """What a front-end needs to reach it (the usual AWS variables)."""
        return {**AWS, "AWS_ENDPOINT_URL": self.endpoint}

    def start(self, bucket: str) -> S3Server:
        log = self.folder / f"moto-{self.port}.log"
        args = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)]
        self.proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT)
        _wait(self._up, self.proc, "moto server", log)
        self.client().create_bucket(Bucket=bucket)
        return self

    def _up(self) -> bool:
        try:
            return httpx.get(self.endpoint, timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS["AWS_DEFAULT_REGION"],
    }
