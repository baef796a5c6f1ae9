import json
import subprocess
import sys

import pytest

from omnistage.info import PipelineInfo, RecognizerInfo, SpeechInfo
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
    with pytest.raises(ValueError, match="an ar stage names its engine"):
        StageSpec(0, kind="ar")
    with pytest.raises(ValueError, match="knobs 'sampling'"):
        StageSpec(0, kind="llm", knobs="sampling")


def test_kind_names_the_engine_and_knobs_what_reaches_the_stage():
    """``kind`` is the engine alone; ``knobs`` (declared, or its engine's) says which request knobs a stage takes.
    A final generation stage stands in for the denoiser of a pipeline that has none."""
    import omnistage.models  # noqa: F401 - registers the built-in families (the registry imports none)
    from omnistage.params import RequestKnobs, denoising_stages, stage_params

    assert StageSpec(0, kind="llm").knobs == "llm" and StageSpec(0, kind="diffusion").knobs == "diffusion"
    csm, omni, codec = get_pipeline("csm"), get_pipeline("qwen_omni"), get_pipeline("codec_tts")
    assert [(s.kind, s.knobs) for s in csm.stages] == [("ar", "llm"), ("generation", "diffusion")]
    assert [(s.kind, s.knobs) for s in omni.stages] == [("llm", "llm"), ("ar", "none"), ("generation", "diffusion")]
    assert denoising_stages(codec) == [1] and denoising_stages(get_pipeline("sd3")) == [0]
    knobs = RequestKnobs(max_tokens=7, temperature=0.5, seed=3)
    routed = stage_params(omni, [{}] * 3, knobs=knobs)
    assert routed[0].max_tokens == 7 and "max_tokens" not in routed[1]  # the talker takes none
    assert routed[2]["seed"] == 3  # the decoder takes the diffusion knobs
    assert stage_params(csm, [{}] * 2, knobs=knobs)[0]["temperature"] == 0.5  # an AR stage that declared llm knobs


def test_info_is_typed_and_checked_when_declared():
    """A pipeline's info is a frozen PipelineInfo: a dict, a misspelt field or a part of the wrong kind fails
    where the family declares it, not on a request."""
    gen = dict(kind="generation", adapter=tp.TextEmbedAdapter, output="latent", final=True)
    with pytest.raises(TypeError, match="info must be an omnistage.info.PipelineInfo"):
        Pipeline("x", [StageSpec(0, **gen)], info={"chat": False})
    with pytest.raises(TypeError, match="sample_rat"):
        SpeechInfo(sample_rat=24000)
    with pytest.raises(TypeError, match="speech must be a SpeechInfo"):
        PipelineInfo(speech=RecognizerInfo())
    with pytest.raises(ValueError, match="default_voice 'bob'"):
        SpeechInfo(voices=["alto"], default_voice="bob")
    info = PipelineInfo(speech=SpeechInfo(voices=["alto"]))
    assert info.speech.voices == ("alto",)  # lists become tuples: nothing downstream appends to shared info
    assert info.with_speech(sample_rate=8000).speech == SpeechInfo(voices=("alto",), sample_rate=8000)


def test_every_registered_family_declares_typed_info():
    import omnistage.models  # noqa: F401 - registers the built-in families (the registry imports none)
    from omnistage.pipeline import registered_pipelines

    for p in registered_pipelines().values():
        assert type(p.info) is PipelineInfo, p.name
        assert p.info.speech is None or type(p.info.speech) is SpeechInfo, p.name
        assert p.info.transcription is None or type(p.info.transcription) is RecognizerInfo, p.name
    speaking = {n for n, p in registered_pipelines().items() if p.info.speech is not None}
    hearing = {n for n, p in registered_pipelines().items() if p.info.transcription is not None}
    assert {"csm", "codec_tts", "qwen3_tts", "vibevoice", "qwen_omni", "qwen2_5_omni"} <= speaking
    assert {"whisper", "voxtral", "qwen3_asr", "qwen_omni", "qwen_omni_thinker"} <= hearing


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
            assert f"kind={s.kind}" in text and f"knobs={s.knobs}" in text and f"output={s.output}" in text
