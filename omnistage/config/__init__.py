"""Deploy configuration (YAML) and server settings (environment)."""

from omnistage.config.loader import (
    ConfigError,
    deep_merge,
    load_deploy_config,
    parse_stage_overrides,
)
from omnistage.config.schema import (
    DeployConfig,
    ParallelConfig,
    RuntimeConfig,
    StageDeployConfig,
)
from omnistage.config.settings import ServerSettings, StorageSettings

__all__ = [
    "ConfigError",
    "DeployConfig",
    "ParallelConfig",
    "RuntimeConfig",
    "ServerSettings",
    "StageDeployConfig",
    "StorageSettings",
    "deep_merge",
    "load_deploy_config",
    "parse_stage_overrides",
]
