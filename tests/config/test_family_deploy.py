"""Every family's shipped deploy YAML loads, validates, and sits under the user's own layers."""

import pytest

import omnistage.models  # noqa: F401 - registers the built-in families
from omnistage.config import ConfigError
from omnistage.engine.builder import resolve_deploy
from omnistage.pipeline import registered_pipelines

SHIPPED = sorted(name for name, p in registered_pipelines().items() if p.deploy_file is not None)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_deploy_yaml_is_valid_and_lowest(name):
    pipeline = registered_pipelines()[name]
    cfg = resolve_deploy(pipeline)
    stage = next(s for s in cfg.stages if s.max_num_seqs is not None)  # the YAML's stage
    assert stage.max_num_seqs == 8 and stage.dtype == "auto" and stage.engine_args == {"max_wait_steps": 8}
    # the pipeline's declared sampling defaults are still there, under the YAML
    spec = pipeline.stage(stage.stage_id)
    assert stage.default_sampling_params == spec.default_params
    # the user's layers win over it
    mine = resolve_deploy(
        pipeline,
        {"stages": [{"stage_id": stage.stage_id, "max_num_seqs": 2}]},
        stage_overrides={str(stage.stage_id): {"dtype": "float32"}},
    )
    assert mine.stage(stage.stage_id).max_num_seqs == 2 and mine.stage(stage.stage_id).dtype == "float32"
    assert mine.stage(stage.stage_id).engine_args == {"max_wait_steps": 8}
    # `--distributed-executor-backend ray` reaches every stage (a family default `process` would shadow it) ...
    ray = resolve_deploy(pipeline, {"distributed_executor_backend": "ray"})
    assert [ray.stage_process(s.stage_id) for s in pipeline.stages] == ["ray"] * len(pipeline.stages)
    # ... unless the user's own layer says where a stage runs
    pinned = resolve_deploy(
        pipeline, {"distributed_executor_backend": "ray"}, stage_overrides={str(stage.stage_id): {"process": "mp"}}
    )
    assert pinned.stage_process(stage.stage_id) == "mp"


def test_image_families_ship_one():
    assert {"sd3", "sd", "flux", "flux_kontext", "qwen_image", "z_image", "wan", "glm_image"} <= set(SHIPPED)


def test_a_bad_key_in_a_user_layer_is_still_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"stages\[0\]\.max_num_seq: unknown key"):
        resolve_deploy(registered_pipelines()["sd3"], {"stages": [{"stage_id": 0, "max_num_seq": 2}]})


def test_acceleration_on_a_non_diffusion_stage_is_refused():
    from omnistage.testing import pipelines as tp

    with pytest.raises(ConfigError, match=r"stages\[0\]\.acceleration: only diffusion stages"):
        resolve_deploy(tp.chain(), {"stages": [{"stage_id": 0, "acceleration": {"compile": True}}]})
