"""omnistage/params.py: the one table of request knobs (``RequestKnobs``) and the one parse into every
stage's parameters (``stage_params``): routing by stage kind, extras filtered once, precedence
(explicit entry > knobs > deploy defaults), errors naming the field, the request hook."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest
from pydantic import ValidationError

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams
from omnistage.params import DiffusionSamplingParams, RequestKnobs, stage_params, validation_error
from omnistage.pipeline import Edge, Pipeline, StageSpec
from omnistage.stages.base import StageRequest
from omnistage.transport.codec import Codec
from omnistage.transport.messages import Command, Generate


def ar_then_dit(**kw: Any) -> Pipeline:
    """An llm stage feeding a diffusion stage (GLM-Image's shape); no engines are started."""
    return Pipeline(
        "test_params_ar_dit",
        [
            StageSpec(0, kind="llm", output="token_ids"),
            StageSpec(1, kind="diffusion", output="image", final=True, inputs=[Edge(0)]),
        ],
        extra_body_params={"mu": float},
        **kw,
    )


def two_denoisers() -> Pipeline:
    """Two diffusion stages (a base and a refiner): both are targets of the diffusion knobs and extras."""
    return Pipeline(
        "test_params_two_dits",
        [
            StageSpec(0, kind="diffusion", output="latent"),
            StageSpec(1, kind="diffusion", output="image", final=True, inputs=[Edge(0)]),
        ],
        extra_body_params={"mu": float},
    )


NO_DEFAULTS = [{}, {}]


def field_of(excinfo: pytest.ExceptionInfo) -> str | None:
    return excinfo.value.field


# ------------------------------------------------------------------ RequestKnobs routing


def test_size_and_n_become_the_diffusion_stage_keys():
    knobs = RequestKnobs(size="48x32", n=3, seed=5, guidance_scale=2.5)
    assert knobs.for_diffusion() == {
        "width": 48,
        "height": 32,
        "num_outputs_per_prompt": 3,
        "seed": 5,
        "guidance_scale": 2.5,
    }
    assert RequestKnobs(size="48x32", width=64).for_diffusion() == {"width": 64, "height": 32}  # explicit wins
    assert RequestKnobs(size="auto").for_diffusion() == {}


def test_max_completion_tokens_is_max_tokens_for_llm_stages():
    assert RequestKnobs(max_completion_tokens=9, temperature=0.0).for_llm() == {"max_tokens": 9, "temperature": 0.0}
    assert RequestKnobs(max_completion_tokens=9, max_tokens=4).for_llm() == {"max_tokens": 4}


def test_each_kind_gets_only_its_own_knobs():
    knobs = RequestKnobs(temperature=0.5, top_p=0.9, guidance_scale=3.0, num_inference_steps=7, seed=1)
    assert knobs.for_llm() == {"temperature": 0.5, "top_p": 0.9, "seed": 1}
    assert knobs.for_diffusion() == {"guidance_scale": 3.0, "num_inference_steps": 7, "seed": 1}


def test_unknown_keys_are_extras_and_unset_knobs_are_absent():
    knobs = RequestKnobs(seed=2, mu="0.5")
    assert knobs.standard() == {"seed": 2} and knobs.extras() == {"mu": "0.5"}


def test_a_nested_extra_body_wins_over_the_top_level():
    merged = RequestKnobs(seed=1, num_inference_steps=4).knobs({"seed": 9, "mu": 1.5})
    assert merged.standard() == {"seed": 9, "num_inference_steps": 4} and merged.extras() == {"mu": 1.5}


# ------------------------------------------------------------------ stage_params


def test_knobs_are_routed_by_stage_kind():
    knobs = RequestKnobs(size="48x32", max_completion_tokens=9, temperature=0.0, seed=4)
    llm, dit = stage_params(ar_then_dit(), NO_DEFAULTS, knobs)
    assert isinstance(llm, LLMSamplingParams) and llm.given() == {"max_tokens": 9, "temperature": 0.0, "seed": 4}
    assert isinstance(dit, DiffusionSamplingParams)
    assert (dit.width, dit.height, dit.seed, dit.extra_args) == (48, 32, 4, {})


def test_explicit_entries_win_over_knobs_and_deploy_defaults_lie_under_both():
    defaults = [{"max_tokens": 100, "temperature": 1.0}, {"num_inference_steps": 28, "guidance_scale": 4.0}]
    knobs = RequestKnobs(temperature=0.2, max_tokens=50, num_inference_steps=20)
    given = [{"max_tokens": 3}, {"guidance_scale": 6.0}]
    llm, dit = stage_params(ar_then_dit(), defaults, knobs, given)
    assert llm.given() == {"max_tokens": 3, "temperature": 0.2}  # entry > knob > default
    assert (dit.num_inference_steps, dit.guidance_scale) == (20, 6.0)
    assert defaults == [{"max_tokens": 100, "temperature": 1.0}, {"num_inference_steps": 28, "guidance_scale": 4.0}]
    # no knobs, no entries: the defaults alone
    llm, dit = stage_params(ar_then_dit(), defaults)
    assert llm.given() == defaults[0] and (dit.num_inference_steps, dit.guidance_scale) == (28, 4.0)


def test_one_entry_not_in_a_list_is_the_first_stages():
    llm, _ = stage_params(ar_then_dit(), NO_DEFAULTS, given={"max_tokens": 2})
    assert llm.given() == {"max_tokens": 2}


def test_an_engines_own_params_object_passes_through_untouched():
    obj = object()  # e.g. a vllm.SamplingParams
    llm, _ = stage_params(ar_then_dit(), NO_DEFAULTS, RequestKnobs(num_inference_steps=9), [obj, None])
    assert llm is obj


def test_a_typed_diffusion_object_sets_only_what_its_caller_set():
    # the fields the caller set win; the others are the stage's defaults (the family's), as a dict's are
    defaults = [{}, {"guidance_scale": 3.0, "num_inference_steps": 30, "fps": 24}]
    mine = DiffusionSamplingParams(seed=1, num_inference_steps=2)
    _, dit = stage_params(ar_then_dit(), defaults, None, [None, mine])
    _, as_dict = stage_params(ar_then_dit(), defaults, None, [None, {"seed": 1, "num_inference_steps": 2}])
    assert dit == as_dict
    assert (dit.guidance_scale, dit.num_inference_steps, dit.fps, dit.seed) == (3.0, 2, 24, 1)
    # set explicitly to the class default still counts as set
    _, dit = stage_params(ar_then_dit(), defaults, None, [None, DiffusionSamplingParams(guidance_scale=7.0)])
    assert dit.guidance_scale == 7.0
    # assigned after construction counts too
    later = DiffusionSamplingParams()
    later.guidance_scale = 5.0
    _, dit = stage_params(ar_then_dit(), defaults, None, [None, later])
    assert (dit.guidance_scale, dit.num_inference_steps) == (5.0, 30)
    # a generator object passes as it is
    gen = DiffusionSamplingParams(generator=__import__("torch").Generator().manual_seed(3))
    _, dit = stage_params(ar_then_dit(), defaults, None, [None, gen])
    assert dit.generator is gen.generator


def test_an_undeclared_extra_args_key_is_an_error_offline_and_a_warning_over_http():
    given = [None, DiffusionSamplingParams(extra_args={"mu": 1, "not_declared": 2})]
    with pytest.raises(InvalidRequestError) as e:
        stage_params(ar_then_dit(), NO_DEFAULTS, None, given)
    assert field_of(e) == "sampling_params_list[1].extra_args.not_declared"
    warnings: list[str] = []
    _, dit = stage_params(ar_then_dit(), NO_DEFAULTS, None, given, warnings=warnings)
    assert dit.extra_args == {"mu": 1.0}
    assert len(warnings) == 1 and "sampling_params_list[1].extra_args.not_declared" in warnings[0]
    # an HTTP body's unknown field: a warning the caller reads back
    warnings = []
    stage_params(ar_then_dit(), NO_DEFAULTS, RequestKnobs(not_declared=1), warnings=warnings)
    assert len(warnings) == 1 and "not_declared" in warnings[0]


def test_a_field_spelled_in_extra_args_is_the_field():
    # ``cache`` was an extra_args key before it became a field: it is the field, never dropped in silence
    _, dit = stage_params(
        ar_then_dit(), NO_DEFAULTS, None, [None, DiffusionSamplingParams(extra_args={"cache": False})]
    )
    assert dit.cache is False and dit.extra_args == {}
    _, dit = stage_params(ar_then_dit(), NO_DEFAULTS, None, [None, {"extra_args": {"guidance_scale": 2.0}}])
    assert dit.guidance_scale == 2.0
    with pytest.raises(InvalidRequestError) as e:  # set both ways to two values
        stage_params(ar_then_dit(), NO_DEFAULTS, None, [None, {"cache": True, "extra_args": {"cache": False}}])
    assert field_of(e) == "sampling_params_list[1].extra_args.cache"


def test_true_cfg_scale_without_a_negative_prompt_is_said():
    warnings: list[str] = []
    stage_params(
        ar_then_dit(), NO_DEFAULTS, RequestKnobs(true_cfg_scale=4.0), prompt={"prompt": "a"}, warnings=warnings
    )
    assert len(warnings) == 1 and "true_cfg_scale=4" in warnings[0]
    warnings = []
    prompt = {"prompt": "a", "negative_prompt": " "}
    stage_params(ar_then_dit(), NO_DEFAULTS, RequestKnobs(true_cfg_scale=4.0), prompt=prompt, warnings=warnings)
    assert warnings == []


def test_num_outputs_per_prompt_is_n():
    assert RequestKnobs(num_outputs_per_prompt=2).for_diffusion() == {"num_outputs_per_prompt": 2}
    assert RequestKnobs(seed=1).knobs({"num_outputs_per_prompt": 3}).n == 3
    with pytest.raises(ValidationError) as e:
        RequestKnobs(n=1, num_outputs_per_prompt=2)
    assert e.value.errors()[0]["loc"] == ("num_outputs_per_prompt",)


def test_extras_are_filtered_once_with_one_warning_and_coerced(caplog):
    knobs = RequestKnobs(mu="0.5", not_declared=1)
    with caplog.at_level(logging.WARNING, logger="omnistage.params"):
        base, refiner = stage_params(two_denoisers(), NO_DEFAULTS, knobs)
    assert caplog.text.count("not_declared") == 1  # two target stages, one warning
    assert base.extra_args == refiner.extra_args == {"mu": 0.5}
    assert type(base.extra_args["mu"]) is float
    # a stage's own extra_args are filtered the same way and win over the request's
    _, dit = stage_params(ar_then_dit(), NO_DEFAULTS, knobs, [None, {"extra_args": {"mu": 2}}])
    assert dit.extra_args == {"mu": 2.0}


def test_extras_reach_only_the_denoising_stages():
    llm, dit = stage_params(ar_then_dit(), NO_DEFAULTS, RequestKnobs(mu=0.25))
    assert llm.given() == {} and dit.extra_args == {"mu": 0.25}


# ------------------------------------------------------------------ errors name the field


@pytest.mark.parametrize(
    "given, field",
    [
        ([{}, {"height": 0}], "sampling_params_list[1].height"),
        ([{}, {"seed": -1}], "sampling_params_list[1].seed"),
        ([{"seed": -1}, {}], "sampling_params_list[0].seed"),
        ([{"temperature": -1}, {}], "sampling_params_list[0].temperature"),
        ([{}, {"not_a_param": 1}], "sampling_params_list[1].not_a_param"),
        ([{}, {"extra_args": [1]}], "sampling_params_list[1].extra_args"),
        ([{}, {}, {}], "sampling_params_list"),
    ],
)
def test_bad_entries_name_their_stage_and_field(given, field):
    with pytest.raises(InvalidRequestError) as e:
        stage_params(ar_then_dit(), NO_DEFAULTS, None, given)
    assert field_of(e) == field


# ------------------------------------------------------------------ llm stages: LLMSamplingParams


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"max_tokens": 0}, r"^sampling_params_list\[0\]\.max_tokens: Input should be greater than or equal to 1$"),
        ({"max_tokens": 2.5}, r"^sampling_params_list\[0\]\.max_tokens: expected an integer"),
        ({"max_tokens": "3"}, r"^sampling_params_list\[0\]\.max_tokens: expected an integer"),  # JSON's own types
        ({"temperature": -1}, r"^sampling_params_list\[0\]\.temperature: Input should be greater than or equal to 0$"),
        ({"temperature": "hot"}, r"^sampling_params_list\[0\]\.temperature: expected a number, got 'hot'$"),
        ({"top_p": 0}, r"^sampling_params_list\[0\]\.top_p: Input should be greater than 0$"),
        (
            {"seed": 2**63},
            r"^sampling_params_list\[0\]\.seed: Input should be less than or equal to 9223372036854775807$",
        ),
        ({"seed": "x"}, r"^sampling_params_list\[0\]\.seed: expected an integer"),
        ({"stop_token_ids": 5}, r"^sampling_params_list\[0\]\.stop_token_ids: expected a list of token ids"),
        ({"ignore_eos": 1}, r"^sampling_params_list\[0\]\.ignore_eos: expected true or false, got 1$"),
        ({"n": 2}, r"^sampling_params_list\[0\]\.n: an llm stage streams one completion per request, got n=2$"),
        ({"bogus": 1, "other": 2}, r"^sampling_params_list\[0\]: unknown field\(s\) bogus, other for an llm stage$"),
    ],
)
def test_a_bad_llm_entry_is_refused_at_admission_naming_the_field(entry, message):
    """Before any stage runs (no engine here), with the caller's own entry named."""
    with pytest.raises(InvalidRequestError, match=message):
        stage_params(ar_then_dit(), NO_DEFAULTS, None, [entry, None])


def test_a_bad_top_level_llm_knob_is_named_without_a_prefix():
    """A knob that reached the llm stage by routing (no entry of the caller's) is named as it was sent."""
    knobs = RequestKnobs.model_construct(temperature="hot")  # (the HTTP body model refuses it before this)
    with pytest.raises(InvalidRequestError) as e:
        stage_params(ar_then_dit(), NO_DEFAULTS, knobs)
    assert field_of(e) == "temperature"


def test_llm_params_remember_which_fields_were_set():
    """Family / deploy defaults, then knobs, then the caller's entry; a typed entry counts only the fields its
    caller set, and a field nobody set stays unset (vLLM's own default applies in the stage)."""
    defaults = [{"max_tokens": 100, "temperature": 1.0}, {}]
    entry = LLMSamplingParams(top_k=5, seed=None)  # seed=None set on purpose: it stays set, as None
    llm, _ = stage_params(ar_then_dit(), defaults, RequestKnobs(temperature=0.2), [entry, None])
    assert llm.given() == {"max_tokens": 100, "temperature": 0.2, "top_k": 5, "seed": None}
    assert llm.top_p is msgspec.UNSET and llm.get("top_p", "vLLM's") == "vLLM's"


def test_llm_params_cross_the_process_codec_as_they_are():
    """The mp transport encodes a request's params with msgspec: only the set fields travel (an explicit None
    included), and the stage types what arrives back into the same object."""
    params = LLMSamplingParams.from_any(
        {"max_tokens": None, "temperature": 0, "stop": ["x"], "logit_bias": {"7": -1.5}, "extra_args": {"k": [1]}}
    )
    codec = Codec(Command)
    got = codec.decode(codec.encode(Generate(StageRequest("r", {"prompt": "p"}, params))))
    assert got.request.params == {
        "max_tokens": None,
        "temperature": 0.0,
        "stop": ["x"],
        "logit_bias": {7: -1.5},
        "extra_args": {"k": [1]},
    }
    assert LLMSamplingParams.from_any(got.request.params) == params
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=LLMSamplingParams) == params


@pytest.mark.parametrize(
    "nested, field",
    [
        ({"seed": -1}, "extra_body.seed"),
        ({"num_inference_steps": 0}, "extra_body.num_inference_steps"),
        ({"size": "big"}, "extra_body.size"),
        ({"top_p": 2}, "extra_body.top_p"),
    ],
)
def test_bad_extra_body_values_name_the_field(nested, field):
    with pytest.raises(InvalidRequestError) as e:
        RequestKnobs().knobs(nested)
    assert field_of(e) == field


def test_negative_seed_is_refused_everywhere():
    with pytest.raises(ValidationError) as e:
        RequestKnobs(seed=-1)  # the top level of a body
    assert validation_error(e.value).field == "seed"
    with pytest.raises(ValidationError):
        DiffusionSamplingParams(seed=-1)
    assert RequestKnobs(seed=0).seed == 0


def test_a_bad_declared_extra_names_it():
    with pytest.raises(InvalidRequestError) as e:
        stage_params(ar_then_dit(), NO_DEFAULTS, RequestKnobs(mu="high"))
    assert field_of(e) == "mu"


def test_a_bad_deploy_default_is_not_blamed_on_the_callers_entry():
    with pytest.raises(InvalidRequestError) as e:
        stage_params(ar_then_dit(), [{}, {"num_inference_steps": 0}])
    assert field_of(e) == "num_inference_steps"


# ------------------------------------------------------------------ the request hook


def test_the_hook_sees_the_merged_dicts_before_they_are_typed():
    seen = []

    def hook(prompt: dict[str, Any], params: list[Any]) -> None:
        seen.append((dict(prompt), [dict(p) for p in params]))
        prompt["image_size"] = (params[1]["height"], params[1]["width"])
        params[0]["max_tokens"] = params[1]["height"] // 8  # a hook may shape any stage's parameters

    pipeline = ar_then_dit(shape_request=hook)
    defaults = [{"temperature": 1.0}, {"guidance_scale": 4.0}]
    prompt = {"prompt": "a cat"}
    llm, dit = stage_params(pipeline, defaults, RequestKnobs(size="64x48"), [None, {"num_inference_steps": 3}], prompt)
    [(hook_prompt, hook_params)] = seen
    assert hook_prompt == {"prompt": "a cat"}
    assert hook_params == [
        {"temperature": 1.0},
        {"guidance_scale": 4.0, "width": 64, "height": 48, "num_inference_steps": 3, "extra_args": {}},
    ]
    assert prompt["image_size"] == (48, 64)
    assert llm.given() == {"temperature": 1.0, "max_tokens": 6} and isinstance(dit, DiffusionSamplingParams)
    # without a prompt (parameters alone) there is nothing to shape
    stage_params(pipeline, defaults, RequestKnobs(size="64x48"))
    assert len(seen) == 1
