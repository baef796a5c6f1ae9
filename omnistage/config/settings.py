"""Server settings from the environment (``OMNISTAGE_SERVER_*``, docs/server.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class StorageSettings(BaseModel):
    path: str = "/tmp/omnistage-storage"
    file_concurrency: int = Field(4, ge=1)
    file_ttl: int | None = Field(None, ge=1)  # seconds; None = files never expire
    ttl_sweep_interval: int | None = Field(None, ge=1)  # seconds; 300 when a TTL is set

    @model_validator(mode="after")
    def _sweep_default(self) -> StorageSettings:
        if self.file_ttl is not None and self.ttl_sweep_interval is None:
            self.ttl_sweep_interval = 300
        return self


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNISTAGE_SERVER_", env_nested_delimiter="__", extra="forbid")

    storage: StorageSettings = Field(default_factory=StorageSettings)
    # Where async jobs live (docs/fleet.md): sqlite:///path (one machine; default: .jobs.sqlite3 under
    # storage.path) or redis://host:port/db (a fleet of front-ends)
    job_store: str | None = None
    # Where their outputs live: file:///path (default: storage.path) or s3://bucket/prefix
    media_store: str | None = None
    # Seconds a front-end holds a job it runs without renewing; a job whose front-end died is taken over
    # (or failed) by another front-end after this long
    job_lease_s: float = Field(30.0, gt=0)
    # A front-end that took over a job this many times already fails it instead (a job that kills its runner)
    job_max_attempts: int = Field(2, ge=1)
    # With a store that has them (s3), GET /v1/videos/{id}/content redirects to a URL presigned this long
    presign_s: int | None = Field(None, ge=1)

    def job_store_url(self) -> str:
        return self.job_store or f"sqlite:///{Path(self.storage.path).resolve() / '.jobs.sqlite3'}"
