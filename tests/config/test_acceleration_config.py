"""The ``acceleration:`` block of a diffusion stage's deploy entry: typed, strict, errors name the key path."""

import re

import pytest

from omnistage.config import ConfigError, load_deploy_config
from omnistage.config.stage_sections import AccelerationConfig

FULL = """
stages:
  - stage_id: 0
    acceleration:
      cache: {method: teacache, threshold: 0.2, warmup_steps: 2, max_consecutive_cached: 3,
              coefficients: [1.5, 0.01]}
      compile: true
      offload: layer
      vae_tiling: true
"""


def test_full_block_is_typed():
    acc = load_deploy_config(FULL).stage(0).acceleration
    assert isinstance(acc, AccelerationConfig)
    assert acc.cache.method == "teacache" and acc.cache.threshold == 0.2 and acc.cache.warmup_steps == 2
    assert acc.cache.max_consecutive_cached == 3 and acc.cache.coefficients == [1.5, 0.01]
    assert acc.compile is True and acc.offload == "layer" and acc.vae_tiling is True


def test_defaults_are_off():
    assert load_deploy_config({"stages": [{"stage_id": 0}]}).stage(0).acceleration is None
    acc = load_deploy_config({"stages": [{"stage_id": 0, "acceleration": {}}]}).stage(0).acceleration
    assert acc.cache is None and acc.compile is False and acc.offload == "none" and acc.vae_tiling is False


@pytest.mark.parametrize(
    "acceleration, where",
    [
        ({"cache": {"method": "first_block", "treshold": 0.1}}, "stages[0].acceleration.cache.treshold: unknown key"),
        ({"cache": {"method": "fbcache", "threshold": 0.1}}, "stages[0].acceleration.cache.method"),
        ({"cache": {"method": "first_block"}}, "stages[0].acceleration.cache.threshold"),
        ({"cache": {"method": "first_block", "threshold": 0}}, "stages[0].acceleration.cache.threshold"),
        (
            {"cache": {"method": "first_block", "threshold": 0.1, "warmup_steps": -1}},
            "stages[0].acceleration.cache.warmup_steps",
        ),
        (
            {"cache": {"method": "first_block", "threshold": 0.1, "coefficients": [1.0]}},
            "stages[0].acceleration.cache: Value error, coefficients: only the teacache method",
        ),
        ({"offload": "gpu"}, "stages[0].acceleration.offload"),
        ({"compile": "yes please"}, "stages[0].acceleration.compile"),
        ({"tiling": True}, "stages[0].acceleration.tiling: unknown key"),
    ],
)
def test_bad_values_name_the_key(acceleration, where):
    with pytest.raises(ConfigError, match=re.escape(where)):
        load_deploy_config({"stages": [{"stage_id": 0, "acceleration": acceleration}]})


def test_only_diffusion_stages_take_it():
    with pytest.raises(ConfigError, match="only diffusion stages"):
        load_deploy_config({"stages": [{"stage_id": 0, "stage_type": "llm", "acceleration": {"compile": True}}]})
