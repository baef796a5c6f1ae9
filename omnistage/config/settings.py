"""Server settings from the environment (``OMNISTAGE_SERVER_*``, docs/server.md)."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

# the deploy file's ``server:`` while ``server_settings`` builds the settings (the layer below the environment)
_DEPLOY_LAYER: ContextVar[dict[str, Any] | None] = ContextVar("deploy_server_settings", default=None)


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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # highest first; nested fields (storage) merge key by key across the layers
        deploy = InitSettingsSource(settings_cls, init_kwargs=_DEPLOY_LAYER.get() or {})
        return init_settings, env_settings, deploy, dotenv_settings, file_secret_settings


def server_settings(flags: dict[str, Any] | None = None, deploy: Any = None) -> ServerSettings:
    """The server's settings: ``flags`` (given on the command line) over the ``OMNISTAGE_SERVER_*`` environment
    over ``deploy`` (a deploy file's ``server:``, a ``ServerDeployConfig``) over the defaults."""
    layer = deploy.model_dump(exclude_none=True) if deploy is not None else {}
    token = _DEPLOY_LAYER.set(layer)
    try:
        return ServerSettings(**{k: v for k, v in (flags or {}).items() if v is not None})
    finally:
        _DEPLOY_LAYER.reset(token)
