"""`omnistage serve` flags map onto AsyncOmni's configuration layers."""

from __future__ import annotations

import argparse

from omnistage import AsyncOmni
from omnistage.cli import serve
from omnistage.cli.main import main
from tests.server.pipelines import image_pipeline


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_flags_reach_the_deploy_config(tmp_path):
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text("stages:\n  - stage_id: 0\n    max_num_seqs: 2\n    seed: 5\n")
    args = parse("--deploy-config", str(yaml), "--max-num-seqs", "4", "--enforce-eager",
                 "--distributed-executor-backend", "mp", "--stage-overrides", '{"0": {"num_threads": 1}}')
    kwargs = serve.engine_kwargs(args)
    kwargs.pop("pipeline")
    engine = AsyncOmni(pipeline=image_pipeline(), **kwargs)
    stage = engine.deploy.stage(0)
    assert engine.deploy.distributed_executor_backend == "mp"
    assert stage.max_num_seqs == 4  # CLI beats the YAML
    assert stage.seed == 5 and stage.num_threads == 1 and stage.enforce_eager is True


def test_unset_flags_leave_defaults():
    kwargs = serve.engine_kwargs(parse())
    assert kwargs == {"pipeline": None, "deploy_config": None}


def test_bad_configuration_exits_with_a_message(capsys, tmp_path):
    assert main(["serve", "--stage-overrides", "{bad"]) == 2
    assert "--stage-overrides is not valid JSON" in capsys.readouterr().err
    assert main(["serve", "--allowed-local-media-path", str(tmp_path / "missing")]) == 2
    assert main(["serve", "--pipeline", "no-such-pipeline"]) == 2
    assert "unknown pipeline" in capsys.readouterr().err
    assert main(["serve", "--pipeline", "demo", "--stage-overrides", '{"9": {"max_num_seqs": 1}}']) == 2
    assert "stage_id 9 does not exist" in capsys.readouterr().err
