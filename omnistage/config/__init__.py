"""Deploy configuration (YAML) and server settings (environment)."""

from omnistage.config.loader import (
    ConfigError,
    deep_merge,
    load_deploy_config,
    parse_stage_overrides,
)
from omnistage.config.schema import DeployConfig, StageDeployConfig
from omnistage.config.settings import ServerSettings, StorageSettings
from omnistage.config.stage_sections import ParallelConfig, RuntimeConfig

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
