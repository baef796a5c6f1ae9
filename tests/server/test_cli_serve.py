"""`omnistage serve` flags map onto AsyncOmni's configuration layers."""

from __future__ import annotations

import argparse

from omnistage import AsyncOmni
from omnistage.cli import serve, serve_config
from omnistage.cli.main import main
from tests.server.pipelines import image_pipeline


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_flags_reach_the_deploy_config(tmp_path):
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text("stages:\n  - stage_id: 0\n    max_num_seqs: 2\n    seed: 5\n")
    args = parse(
        "--deploy-config",
        str(yaml),
        "--max-num-seqs",
        "4",
        "--enforce-eager",
        "--distributed-executor-backend",
        "mp",
        "--stage-overrides",
        '{"0": {"num_threads": 1}}',
    )
    kwargs = serve_config.engine_kwargs(args)
    kwargs.pop("pipeline")
    engine = AsyncOmni(pipeline=image_pipeline(), **kwargs)
    stage = engine.deploy.stage(0)
    assert engine.deploy.distributed_executor_backend == "mp"
    assert stage.max_num_seqs == 4  # CLI beats the YAML
    assert stage.seed == 5 and stage.num_threads == 1 and stage.enforce_eager is True


def test_limit_mm_per_prompt_reaches_the_stage_and_vllm(tiny_model):
    """vLLM's flag, as JSON; it lands on the stage's deploy entry and in vLLM's engine args."""
    from omnistage.pipeline import StageContext
    from omnistage.stages.llm.args import engine_args_for

    kwargs = serve_config.engine_kwargs(parse("--limit-mm-per-prompt", '{"image": 2, "video": {"count": 0}}'))
    engine = AsyncOmni(tiny_model("chat"), **kwargs)
    stage = engine.deploy.stage(0)
    assert stage.limit_mm_per_prompt == {"image": 2, "video": {"count": 0}}
    args = engine_args_for(StageContext(spec=engine.pipeline.stages[0], deploy=stage, model=engine.model))
    assert args["limit_mm_per_prompt"] == {"image": 2, "video": {"count": 0}}


def test_unset_flags_leave_defaults():
    kwargs = serve_config.engine_kwargs(parse())
    assert kwargs == {"pipeline": None, "deploy_config": None}


def test_bad_configuration_exits_with_a_message(capsys, tmp_path):
    assert main(["serve", "--stage-overrides", "{bad"]) == 2
    assert "--stage-overrides is not valid JSON" in capsys.readouterr().err
    assert main(["serve", "--allowed-local-media-path", str(tmp_path / "missing")]) == 2
    assert main(["serve", "--limit-mm-per-prompt", "image=2"]) == 2
    assert "--limit-mm-per-prompt is not valid JSON" in capsys.readouterr().err
    assert main(["serve", "--limit-mm-per-prompt", '{"image": -1}']) == 2
    assert "limit_mm_per_prompt.image: expected a count >= 0" in capsys.readouterr().err
    assert main(["serve", "--pipeline", "no-such-pipeline"]) == 2
    assert "unknown pipeline" in capsys.readouterr().err
    assert main(["serve", "--pipeline", "demo", "--stage-overrides", '{"9": {"max_num_seqs": 1}}']) == 2
    assert "stage_id 9 does not exist" in capsys.readouterr().err


def test_serve_logs_the_layout_of_each_multi_device_replica(caplog):
    """Once per multi-device diffusion replica, before anything starts: ranks, degrees, devices, backend."""
    import logging

    import torch

    from omnistage.models.sd3 import PIPELINE

    deploy = {
        "stages": [
            {"stage_id": 0, "num_replicas": 2, "devices": [0, 1, 2, 3], "parallel_config": {"cfg_parallel_size": 2}}
        ]
    }
    engine = AsyncOmni(pipeline=PIPELINE, deploy_config=deploy)
    with caplog.at_level(logging.INFO, logger="omnistage.serve"):
        serve_config.log_parallel_layouts(engine)
    lines = [r.getMessage() for r in caplog.records if r.name == "omnistage.serve"]
    if torch.cuda.is_available():  # the rule of a single-device replica: given devices are GPUs when there are any
        devices, backend = ["cuda:0,cuda:1", "cuda:2,cuda:3"], "cpu:gloo,cuda:nccl"
    else:
        devices, backend = ["cpu,cpu", "cpu,cpu"], "cpu:gloo"
    assert lines == [
        f"stage 0 replica {i}: 2 ranks, cfg_parallel_size=2 x ulysses_degree=1, devices {d}, backend {backend}"
        for i, d in enumerate(devices)
    ]
    assert not engine.started  # nothing was started to say it

    caplog.clear()
    one_device = AsyncOmni(pipeline=PIPELINE, deploy_config={"stages": [{"stage_id": 0, "num_replicas": 2}]})
    with caplog.at_level(logging.INFO, logger="omnistage.serve"):
        serve_config.log_parallel_layouts(one_device)
    assert [r for r in caplog.records if r.name == "omnistage.serve"] == []


def test_a_port_in_use_fails_before_any_model_loads(capsys):
    """The socket is bound before the engine starts: a taken port is a one-line error at once (exit 2), not a
    traceback after the models loaded."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--host", "127.0.0.1", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--port {port}" in err and "in use" in err
