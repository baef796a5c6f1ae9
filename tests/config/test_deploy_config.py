import json

import pytest

from omnistage.config import ConfigError, ServerSettings, load_deploy_config
from omnistage.engine.builder import resolve_deploy
from omnistage.testing import pipelines as tp

FULL = """
pipeline: glm_image
async_chunk: false
distributed_executor_backend: mp
connectors:
  shm: {name: SharedMemoryConnector, extra: {threshold_bytes: 65536}}
stages:
  - stage_id: 0
    devices: "0"
    max_num_seqs: 1
    gpu_memory_utilization: 0.5
    enforce_eager: true
    max_model_len: 32768
    engine_output_type: token_ids
    connector: shm
    default_sampling_params: {temperature: 0.9, top_p: 0.75, top_k: 16512,
                              stop_token_ids: [16385], max_tokens: 4353, seed: 42, detokenize: false}
  - stage_id: 1
    runtime: {devices: "1,2,3,4", num_replicas: 2}
    parallel_config: {world_size: 2}
    default_sampling_params: {num_inference_steps: 50, guidance_scale: 1.5, height: 1024, width: 1024, seed: 42}
platforms:
  cpu: {stages: [{stage_id: 0, enforce_eager: false}]}
  cuda: {stages: [{stage_id: 0, max_num_seqs: 8}]}
"""


def test_full_yaml():
    cfg = load_deploy_config(FULL, platform="cuda")
    assert cfg.pipeline == "glm_image" and cfg.async_chunk is False
    s0, s1 = cfg.stage(0), cfg.stage(1)
    assert s0.max_num_seqs == 8 and s0.enforce_eager is True  # cuda overlay applied, cpu one not
    assert s0.engine_output_type == "token_ids"
    assert s0.default_sampling_params["detokenize"] is False
    assert cfg.connectors["shm"].extra["threshold_bytes"] == 65536
    assert s1.replicas == 2 and s1.devices_per_replica == 2
    assert s1.replica_devices() == [["1", "2"], ["3", "4"]]
    assert load_deploy_config(FULL, platform="cpu").stage(0).enforce_eager is False


def test_path_and_dict_sources(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(FULL)
    assert load_deploy_config(f, platform="cpu") == load_deploy_config(str(f), platform="cpu")
    assert load_deploy_config({"stages": [{"stage_id": 0, "max_num_seqs": 3}]}).stage(0).max_num_seqs == 3


def test_stage_level_parallel_sizes_are_accepted_both_ways():
    a = load_deploy_config({"stages": [{"stage_id": 0, "tensor_parallel_size": 2, "devices": "0,1"}]}).stage(0)
    b = load_deploy_config(
        {"stages": [{"stage_id": 0, "parallel_config": {"tensor_parallel_size": 2}, "devices": "0,1"}]}
    ).stage(0)
    assert a.tp_size == b.tp_size == 2 and a.devices_per_replica == b.devices_per_replica == 2


def test_base_config_inherits_and_deep_merges(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "async_chunk: true\nstages:\n  - stage_id: 0\n    max_num_seqs: 4\n    default_sampling_params: {max_tokens: 10, seed: 1}\n"
        "  - stage_id: 1\n    max_num_seqs: 2\n"
    )
    (tmp_path / "child.yaml").write_text(
        "base_config: base.yaml\nstages:\n  - stage_id: 0\n    default_sampling_params: {seed: 2}\n"
    )
    cfg = load_deploy_config(tmp_path / "child.yaml")
    assert cfg.async_chunk is True
    assert cfg.stage(0).max_num_seqs == 4
    assert cfg.stage(0).default_sampling_params == {"max_tokens": 10, "seed": 2}
    assert cfg.stage(1).max_num_seqs == 2


def test_base_config_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("base_config: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base_config: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_deploy_config(tmp_path / "a.yaml")


def test_legacy_stage_args_format():
    legacy = """
stage_args:
  - stage_id: 0
    runtime: {devices: "0", max_batch_size: 4}
    engine_args:
      model_stage: thinker
      engine_output_type: text
      max_model_len: 8192
      enforce_eager: true
      hf_config_name: thinker_config
    final_output: true
    final_output_type: text
    default_sampling_params: {temperature: 0.0, max_tokens: 64}
"""
    s = load_deploy_config(legacy).stage(0)
    assert s.model_stage == "thinker" and s.engine_output_type == "text" and s.max_model_len == 8192
    assert s.max_num_seqs == 4 and s.device_list == ["0"]
    assert s.final_output is True and s.final_output_type == "text"
    assert s.engine_args == {"hf_config_name": "thinker_config"}
    assert s.default_sampling_params["max_tokens"] == 64


def test_overrides_json_and_precedence():
    yaml_text = "stages:\n  - stage_id: 1\n    max_num_seqs: 2\n    num_replicas: 1\n"
    overrides = json.dumps({"1": {"num_replicas": 2, "devices": "1,2", "max_num_seqs": 3}})
    cfg = load_deploy_config(
        yaml_text, overrides, defaults={"stages": [{"stage_id": 1, "max_num_seqs": 1, "dtype": "float32"}]}
    )
    s = cfg.stage(1)
    assert s.replicas == 2 and s.replica_devices() == [["1"], ["2"]]
    assert s.max_num_seqs == 3  # overrides > YAML > defaults
    assert s.dtype == "float32"  # from the pipeline defaults
    cli = load_deploy_config(yaml_text, overrides, cli={"max_num_seqs": 9})
    assert cli.stage(1).max_num_seqs == 9  # CLI > overrides
    assert load_deploy_config(yaml_text, {1: {"max_num_seqs": 5}}).stage(1).max_num_seqs == 5


@pytest.mark.parametrize(
    "yaml_stage, override",
    [
        ({"runtime": {"devices": "0,1,2,3", "num_replicas": 2}}, {"num_replicas": 2, "devices": "1,2"}),
        ({"devices": "0,1,2,3", "num_replicas": 2}, {"runtime": {"num_replicas": 2, "devices": "1,2"}}),
        ({"runtime": {"devices": "0,1,2,3", "num_replicas": 2}}, {"runtime": {"num_replicas": 2, "devices": "1,2"}}),
    ],
)
def test_override_placement_wins_whichever_placement_either_side_uses(yaml_stage, override):
    """--stage-overrides over a YAML (or pipeline default) that places the stage the other way."""
    yaml_cfg = {"stages": [{"stage_id": 1, **yaml_stage}]}
    for layered in (
        load_deploy_config(yaml_cfg, {"1": override}),
        load_deploy_config(None, {"1": override}, defaults=yaml_cfg),
    ):
        s = layered.stage(1)
        assert s.replicas == 2 and s.replica_devices() == [["1"], ["2"]]


@pytest.mark.parametrize(
    "source, overrides, message",
    [
        ({"stages": [{"stage_id": 0, "max_num_seq": 2}]}, None, r"stages\[0\]\.max_num_seq: unknown key"),
        ({"stagez": []}, None, r"stagez: unknown key"),
        ({"stages": [{"stage_id": 0, "runtime": {"device": "0"}}]}, None, r"stages\[0\]\.runtime\.device: unknown key"),
        ({"stages": [{"stage_id": 0, "engine_output_type": "latents"}]}, None, r"invalid output type 'latents'"),
        (
            {"stages": [{"stage_id": 0, "engine_output_type": "text + audio"}]},
            None,
            r"invalid output type 'text \+ audio'",
        ),
        (
            {"stages": [{"stage_id": 0, "runtime": {"devices": "0,1,2", "num_replicas": 2}}]},
            None,
            r"has 3 entries; expected num_replicas \(2\)",
        ),
        ({"stages": [{"stage_id": 0, "devices": "0,1", "tensor_parallel_size": 1}]}, None, r"expected num_replicas"),
        ({"stages": [{"stage_id": 0, "devices": "0,0"}]}, None, r"lists a device twice"),
        (
            {"stages": [{"stage_id": 0, "devices": "0", "runtime": {"devices": "0"}}]},
            None,
            r"both at stage level and under runtime",
        ),
        ({"stages": [{"stage_id": 0}, {"stage_id": 0}]}, None, r"stage_id 0 appears more than once"),
        ({"stages": [{"max_num_seqs": 1}]}, None, r"stages\[0\]\.stage_id: Field required"),
        (
            {"stages": [{"stage_id": 0, "max_num_seqs": 0}]},
            None,
            r"max_num_seqs: Input should be greater than or equal to 1",
        ),
        ({"stages": [{"stage_id": 0, "connector": "nope"}]}, None, r"connector 'nope'"),
        ({"stages": [{"stage_id": 0, "limit_mm_per_prompt": {"image": "two"}}]}, None, r"limit_mm_per_prompt"),
        (
            {"stages": [{"stage_id": 0, "limit_mm_per_prompt": {"video": {"count": -1}}}]},
            None,
            r"limit_mm_per_prompt\.video: expected a count >= 0",
        ),
        ({"distributed_executor_backend": "slurm"}, None, r"distributed_executor_backend"),
        ({}, "{not json", r"not valid JSON"),
        ({}, '{"x": {}}', r"key 'x' is not a stage id"),
        ({}, '{"0": 3}', r"expected an object"),
        ({}, '{"0": {"bogus": 1}}', r"stages\[0\]\.bogus: unknown key"),
        ("a: [1, 2", None, r"not valid YAML"),
        ("- 1\n- 2\n", None, r"mapping at the top level"),
        ("missing.yaml", None, r"does not exist"),
        ({"stage_args": [], "stages": []}, None, r"cannot both be given"),
    ],
)
def test_validation_errors(source, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_deploy_config(source, overrides)


def test_config_checked_against_the_pipeline():
    p = tp.chain()
    with pytest.raises(ConfigError, match="stage_id 7 does not exist"):
        resolve_deploy(p, {"stages": [{"stage_id": 7}]})
    with pytest.raises(ConfigError, match="stage_type: 'llm'"):
        resolve_deploy(p, {"stages": [{"stage_id": 0, "stage_type": "llm"}]})
    with pytest.raises(ConfigError, match="cannot produce text"):
        resolve_deploy(p, {"stages": [{"stage_id": 2, "engine_output_type": "text"}]})
    assert resolve_deploy(p, {"distributed_executor_backend": "ray"}).distributed_executor_backend == "ray"
    with pytest.raises(ConfigError, match="deploy config is for 'other'"):
        resolve_deploy(p, {"pipeline": "other"})
    bad = r"stages\[0\]\.default_sampling_params\.temperature: Input should be greater than or equal to 0"
    with pytest.raises(ConfigError, match=bad):
        resolve_deploy(tp.streaming(), {"stages": [{"stage_id": 0, "default_sampling_params": {"temperature": -1}}]})
    one = tp.streaming()
    one.stages = one.stages[:1]
    one.stages[0].final = True
    with pytest.raises(ConfigError, match="async_chunk: invalid for a one-stage pipeline"):
        resolve_deploy(one, {"async_chunk": True})
    cfg = resolve_deploy(p, None)
    assert cfg.stage(2).engine_output_type == "latent" and cfg.stage(2).final_output is True


def test_server_settings_from_env(monkeypatch):
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__PATH", "/tmp/x")
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__FILE_CONCURRENCY", "8")
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__FILE_TTL", "60")
    s = ServerSettings()
    assert s.storage.path == "/tmp/x" and s.storage.file_concurrency == 8
    assert s.storage.file_ttl == 60 and s.storage.ttl_sweep_interval == 300
    monkeypatch.delenv("OMNISTAGE_SERVER_STORAGE__FILE_TTL")
    assert ServerSettings().storage.ttl_sweep_interval is None
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__FILE_CONCURRENCY", "many")
    with pytest.raises(ValueError, match="file_concurrency"):
        ServerSettings()
