import json
import subprocess
import sys

import pytest

from omnistage.pipeline import Edge, Pipeline, StageSpec, get_pipeline, register_pipeline, resolve_pipeline
from omnistage.testing import pipelines as tp

_by_diffusers = register_pipeline(
    Pipeline(
        "test_resolve_diffusers",
        [StageSpec(0, kind="generation", adapter=tp.TextEmbedAdapter, output="latent", final=True)],
        matches=lambda f: f.diffusers_class == "TestOnlyPipeline",
    ),
    replace=True,
)
_by_arch = register_pipeline(
    Pipeline(
        "test_resolve_arch",
        [StageSpec(0, kind="generation", adapter=tp.TextEmbedAdapter, output="latent", final=True)],
        matches=lambda f: "TestOnlyForCausalLM" in f.architectures,
    ),
    replace=True,
)


def test_resolve_from_model_folder(tmp_path):
    d = tmp_path / "diff"
    d.mkdir()
    (d / "model_index.json").write_text(json.dumps({"_class_name": "TestOnlyPipeline"}))
    assert resolve_pipeline(d) is _by_diffusers
    t = tmp_path / "tf"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"architectures": ["TestOnlyForCausalLM"]}))
    assert resolve_pipeline(t) is _by_arch
    assert resolve_pipeline(t, "test_resolve_diffusers") is _by_diffusers  # an explicit name wins
    (t / "omnistage.json").write_text(json.dumps({"pipeline": "test_resolve_diffusers"}))
    assert resolve_pipeline(t) is _by_diffusers


def test_resolution_errors(tmp_path):
    with pytest.raises(ValueError, match="not a local folder"):
        resolve_pipeline(tmp_path / "nope")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Unknown"]}))
    with pytest.raises(ValueError, match="no registered pipeline matches"):
        resolve_pipeline(tmp_path)
    with pytest.raises(ValueError, match="unknown pipeline 'zzz'"):
        get_pipeline("zzz")
    with pytest.raises(ValueError, match="already registered"):
        register_pipeline(Pipeline("test_resolve_arch", list(_by_arch.stages)))


def test_declaration_is_checked():
    gen = dict(kind="generation", adapter=tp.TextEmbedAdapter, output="latent")
    with pytest.raises(ValueError, match="stage ids must be 0..1"):
        Pipeline("x", [StageSpec(0, **gen, final=True), StageSpec(2, **gen)])
    with pytest.raises(ValueError, match="no stage is marked final"):
        Pipeline("x", [StageSpec(0, **gen)])
    with pytest.raises(ValueError, match="edges must point from an earlier stage"):
        Pipeline("x", [StageSpec(0, **gen, inputs=[Edge(1)]), StageSpec(1, **gen, final=True)])
    with pytest.raises(ValueError, match="kind 'audio'"):
        StageSpec(0, kind="audio")
    with pytest.raises(ValueError, match="invalid output type 'latents'"):
        StageSpec(0, kind="generation", output="latents")


def test_pipelines_command_lists_stages():
    out = subprocess.run(
        [sys.executable, "-m", "omnistage.cli.main", "pipelines"], capture_output=True, text=True, check=True
    )
    text = out.stdout
    # Every built-in family appears with its stages, kinds and output types.
    import omnistage.models  # noqa: F401 - registers the built-in families (the registry imports none)
    from omnistage.pipeline import registered_pipelines

    names = set(registered_pipelines())
    assert {"sd3", "flux", "sana", "pixart_sigma", "flux2_klein", "flux2", "qwen_image_21"} <= names
    for p in registered_pipelines().values():
        if p.name.startswith("test_"):
            continue
        assert p.name in text
        for s in p.stages:
            assert f"kind={s.kind}" in text and f"output={s.output}" in text
