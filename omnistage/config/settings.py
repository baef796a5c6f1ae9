"""Server settings from the environment (``OMNISTAGE_SERVER_*``, docs/server.md)."""

from __future__ import annotations

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
