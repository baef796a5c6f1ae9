"""Load a deploy config: YAML file / string / dict, ``base_config`` inheritance,
platform overlays, the legacy ``stage_args:`` format and ``--stage-overrides``.

Precedence (lowest first): pipeline defaults < YAML (base, then file, then
platform overlay) < stage overrides < CLI flags. Layers are plain dicts merged
in that order and validated once at the end, so an error always names the key
path as the user wrote it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from omnistage.config.schema import DeployConfig, StageDeployConfig


class ConfigError(ValueError):
    """A deploy configuration is invalid; the message names the offending key."""


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``stages`` lists merge entry-wise by ``stage_id``."""
    out = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        if key == "stages" and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = merge_stage_lists(out[key], value)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_stage_lists(base: list[dict], overlay: list[dict]) -> list[dict]:
    merged = {_stage_id(s, f"stages[{i}]"): copy.deepcopy(s) for i, s in enumerate(base)}
    for i, entry in enumerate(overlay):
        sid = _stage_id(entry, f"stages[{i}]")
        merged[sid] = deep_merge(_without_overridden_placement(merged.get(sid, {}), entry), entry)
    return [merged[k] for k in sorted(merged)]


# Fields a stage may place either at its top level or under ``runtime:``.
_PLACEMENT = ("devices", "num_replicas", "process")


def _without_overridden_placement(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """A higher layer that sets a placement field wins wherever the lower layer put it: drop the lower
    layer's copy under the other placement (both placements in one layer stay an error)."""
    base = copy.deepcopy(dict(base))
    over_rt = overlay.get("runtime") if isinstance(overlay.get("runtime"), Mapping) else {}
    base_rt = base.get("runtime") if isinstance(base.get("runtime"), dict) else None
    for key in _PLACEMENT:
        if key in overlay and base_rt is not None:
            base_rt.pop(key, None)
        if key in over_rt:
            base.pop(key, None)
    # a fixed replica count and a scaling one (``replicas: {min, max}``) replace each other across layers
    if "replicas" in overlay:
        base.pop("num_replicas", None)
        if base_rt is not None:
            base_rt.pop("num_replicas", None)
    if "num_replicas" in overlay or "num_replicas" in over_rt:
        base.pop("replicas", None)
    return base


def _stage_id(entry: Any, where: str) -> int:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(entry).__name__}")
    if "stage_id" not in entry:
        raise ConfigError(f"{where}.stage_id: field required")
    sid = entry["stage_id"]
    if isinstance(sid, bool) or not isinstance(sid, int):
        try:
            return int(str(sid))
        except ValueError:
            raise ConfigError(f"{where}.stage_id: expected an integer, got {sid!r}") from None
    return sid


# --------------------------------------------------------------------------- sources


def _read_source(source: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], Path | None]:
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), None
    text: str
    path: Path | None = None
    if isinstance(source, Path) or (
        isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml"))
    ):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"deploy config file {str(path)!r} does not exist")
        text = path.read_text()
    else:
        text = str(source)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"deploy config is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"deploy config must be a mapping at the top level, got {type(data).__name__}")
    return data, path


def _resolve_base(data: dict[str, Any], path: Path | None, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    base_ref = data.pop("base_config", None)
    if base_ref is None:
        return data
    base_path = Path(base_ref)
    if not base_path.is_absolute() and path is not None:
        base_path = path.parent / base_path
    base_path = base_path.resolve()
    if base_path in seen:
        raise ConfigError(f"base_config cycle through {str(base_path)!r}")
    base_data, _ = _read_source(base_path)
    base_data = _resolve_base(_from_legacy(base_data), base_path, seen + (base_path,))
    return deep_merge(base_data, data)


# --------------------------------------------------------------------------- legacy format

_STAGE_FIELDS = set(StageDeployConfig.model_fields)
_LEGACY_RUNTIME = {"max_batch_size": "max_num_seqs"}


def _from_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """Translate the legacy ``stage_args:`` list into the ``stages:`` schema."""
    if "stage_args" not in data:
        return data
    if "stages" in data:
        raise ConfigError("stage_args (legacy) and stages cannot both be given")
    data = dict(data)
    legacy = data.pop("stage_args")
    if not isinstance(legacy, list):
        raise ConfigError("stage_args: expected a list of stages")
    stages = []
    for i, entry in enumerate(legacy):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"stage_args[{i}]: expected a mapping")
        entry = dict(entry)
        stage: dict[str, Any] = {}
        engine_args = dict(entry.pop("engine_args", None) or {})
        runtime = dict(entry.pop("runtime", None) or {})
        for key, target in _LEGACY_RUNTIME.items():
            if key in runtime:
                stage[target] = runtime.pop(key)
        if isinstance(runtime.get("process"), bool):  # legacy: "run in its own process"
            runtime["process"] = "mp" if runtime["process"] else "inline"
        if runtime:
            stage["runtime"] = runtime
        for key, value in engine_args.items():
            if key in _STAGE_FIELDS and key not in ("engine_args", "stage_id"):
                stage[key] = value
            else:
                stage.setdefault("engine_args", {})[key] = value
        stage.update(entry)  # stage_id, final_output, final_output_type, default_sampling_params, ...
        stages.append(stage)
    data["stages"] = stages
    return data


# --------------------------------------------------------------------------- overrides


def parse_stage_overrides(overrides: str | Mapping[Any, Any] | None) -> list[dict[str, Any]]:
    """``{"1": {"num_replicas": 2}}`` (dict or JSON string) -> a ``stages`` overlay list."""
    if overrides is None or overrides == "":
        return []
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError as e:
            raise ConfigError(f"stage overrides are not valid JSON: {e}") from None
    if not isinstance(overrides, Mapping):
        raise ConfigError("stage overrides must be a JSON object keyed by stage id")
    out = []
    for key, fields in overrides.items():
        try:
            sid = int(key)
        except (TypeError, ValueError):
            raise ConfigError(f"stage overrides: key {key!r} is not a stage id") from None
        if not isinstance(fields, Mapping):
            raise ConfigError(f"stage overrides[{key}]: expected an object of stage fields")
        out.append({**fields, "stage_id": sid})
    return out


# --------------------------------------------------------------------------- entry point


def detect_platform() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"


def load_deploy_config(
    source: str | Path | Mapping[str, Any] | None = None,
    stage_overrides: str | Mapping[Any, Any] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
    cli: Mapping[str, Any] | None = None,
    platform: str | None = None,
) -> DeployConfig:
    """Resolve and validate a deploy config.

    ``defaults`` is the pipeline's own deploy dict (lowest precedence); ``cli``
    holds stage fields from command-line flags, applied to every stage
    (highest precedence).
    """
    data: dict[str, Any] = {}
    if source is not None:
        data, path = _read_source(source)
        data = _resolve_base(_from_legacy(data), path)
    platforms = data.pop("platforms", None) or {}
    if not isinstance(platforms, Mapping):
        raise ConfigError("platforms: expected a mapping of platform name to overlay")
    overlay = platforms.get(platform or detect_platform())
    if overlay is not None:
        if not isinstance(overlay, Mapping):
            raise ConfigError(f"platforms.{platform}: expected a mapping")
        data = deep_merge(data, _from_legacy(dict(overlay)))
    merged = deep_merge(_from_legacy(dict(defaults or {})), data)
    extra = parse_stage_overrides(stage_overrides)
    if extra:
        merged = deep_merge(merged, {"stages": extra})
    if cli:
        merged = deep_merge(
            merged, {"stages": [{**cli, "stage_id": _stage_id(s, "stages")} for s in merged.get("stages", [])]}
        )
    try:
        return DeployConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, merged)) from None


def format_validation_error(err: ValidationError, data: Mapping[str, Any] | None = None) -> str:
    lines = []
    for item in err.errors():
        loc = ""
        for part in item["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{loc or '<root>'}: {msg}")
    return "invalid deploy config: " + "; ".join(lines)
