"""Where a request's parameters come from, in one order: the family's declaration ← the deploy (YAML, then
``--stage-overrides``) ← the request, and only what the caller set counts as set.

One knob at each level on the tiny SD3 folder, read back from the typed ``DiffusionSamplingParams`` that
``AsyncOmni.make_request`` builds (parameters are resolved at admission, before any stage runs), and the same
for an llm stage's ``LLMSamplingParams``. A bad knob is the same ``InvalidRequestError`` offline as the 400 over
HTTP: same field, same message (the llm case: tests/server/test_errors.py).
"""

from __future__ import annotations

import pytest

from omnistage import AsyncOmni, DiffusionSamplingParams, InvalidRequestError, LLMSamplingParams, RequestKnobs
from omnistage.testing import pipelines as tp
from omnistage.testing.tiny import build

DEPLOY = """
stages:
  - stage_id: 0
    default_sampling_params: {guidance_scale: 5.5, num_inference_steps: 6, max_sequence_length: 64}
"""
OVERRIDES = '{"0": {"default_sampling_params": {"num_inference_steps": 4, "max_sequence_length": 64}}}'


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    return build("sd3", tmp_path_factory.mktemp("sd3") / "sd3")


def family_default(engine: AsyncOmni, name: str):
    return engine.pipeline.stages[0].default_params[name]


def test_each_layer_wins_over_the_one_below(sd3, tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(DEPLOY)
    engine = AsyncOmni(str(sd3), deploy_config=deploy, stage_overrides=OVERRIDES)
    # the family declares guidance 7.0 and 28 steps; the YAML sets guidance and steps; the overrides set steps
    assert (family_default(engine, "guidance_scale"), family_default(engine, "num_inference_steps")) == (7.0, 28)
    (params,) = engine.make_request("a red square").sampling_params
    assert (params.guidance_scale, params.num_inference_steps) == (5.5, 4)  # deploy YAML, then overrides
    (params,) = engine.make_request("a red square", knobs=RequestKnobs(guidance_scale=2.0)).sampling_params
    assert (params.guidance_scale, params.num_inference_steps) == (2.0, 4)  # the request's knob on top
    # offline, a typed object counts only the fields its caller set: the rest keep the layers below
    (params,) = engine.make_request("x", sampling_params_list=[DiffusionSamplingParams(seed=3)]).sampling_params
    assert (params.guidance_scale, params.num_inference_steps, params.seed) == (5.5, 4, 3)


LLM_DEPLOY = """
stages:
  - stage_id: 0
    default_sampling_params: {temperature: 0.5, top_k: 8, max_tokens: 6}
"""
LLM_OVERRIDES = '{"0": {"default_sampling_params": {"top_k": 4}}}'


def test_each_layer_wins_over_the_one_below_for_an_llm_knob(tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(LLM_DEPLOY)
    pipeline = tp.streaming()  # its stage 0 is an llm stage; the family declares a temperature and top_k
    pipeline.stages[0].default_params = {"temperature": 0.7, "top_k": 16}
    engine = AsyncOmni(pipeline=pipeline, deploy_config=deploy, stage_overrides=LLM_OVERRIDES)
    params = engine.make_request("x").sampling_params[0]
    assert isinstance(params, LLMSamplingParams)
    assert params.given() == {"temperature": 0.5, "top_k": 4, "max_tokens": 6}  # deploy YAML, then overrides
    params = engine.make_request("x", knobs=RequestKnobs(temperature=0.1)).sampling_params[0]
    assert (params.temperature, params.top_k) == (0.1, 4)  # the request's knob on top
    # offline, a typed object counts only the fields its caller set; nobody set top_p: it stays unset (vLLM's)
    params = engine.make_request("x", sampling_params_list=[LLMSamplingParams(seed=3)]).sampling_params[0]
    assert params.given() == {"temperature": 0.5, "top_k": 4, "max_tokens": 6, "seed": 3}
    assert params.get("top_p") is None


def test_the_family_default_stands_when_no_layer_sets_it(sd3):
    engine = AsyncOmni(str(sd3))
    (params,) = engine.make_request("a red square").sampling_params
    assert (params.guidance_scale, params.num_inference_steps) == (7.0, 28)


@pytest.mark.parametrize("knob, value", [("guidance_scale", -1.0), ("num_inference_steps", 0)])
def test_a_bad_knob_is_the_same_error_offline_and_over_http(sd3, server_factory, knob, value):
    engine = AsyncOmni(str(sd3))
    with pytest.raises(InvalidRequestError) as offline:
        engine.make_request("x", sampling_params_list=[{knob: value}])
    srv = server_factory(engine)
    with srv.client() as c:
        r = c.post("/v1/images/generations", json={"prompt": "x", "size": "64x64", knob: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == knob and offline.value.field == f"sampling_params_list[0].{knob}"
    assert error["message"] == f"{knob}: {offline.value.message}"  # the same check, named by where it was sent
