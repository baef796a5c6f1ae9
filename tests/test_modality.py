import numpy as np
import pytest
import torch

from omnistage.modality import AccumulationRule, OutputAccumulator, OutputModality, normalize_keys

M = OutputModality


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, M.TEXT),
        ("text", M.TEXT),
        ("text+audio", M.TEXT | M.AUDIO),
        ("image,latent", M.IMAGE | M.LATENT),
        ("token_ids", M.TOKEN_IDS),
        ("video", M.VIDEO),
        ("video+action", M.VIDEO | M.ACTION),
        ("video+audio+action", M.VIDEO | M.AUDIO | M.ACTION),
        ("action", M.ACTION),
    ],
)
def test_parse_accepts_canonical(value, expected):
    assert M.parse(value) == expected


def test_token_ids_is_its_own_modality():
    assert M.parse("token_ids") != M.TEXT and not (M.parse("token_ids") & M.TEXT)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "text+",
        "latents",
        "tokens",
        "speech",
        "wav",
        "img",
        "Text",
        " text",
        "text + audio",
        "foo",
        "+text",
        "text,,audio",
        "actions",
        "video+actions",
        "Action",
    ],
)
def test_parse_rejects_with_value_and_canonical_names(value):
    with pytest.raises(ValueError) as e:
        M.parse(value)
    msg = str(e.value)
    assert repr(value) in msg
    for name in ("text", "image", "audio", "video", "latent", "token_ids", "action"):
        assert name in msg


def test_parse_rejects_non_strings():
    with pytest.raises(ValueError, match="expected a string"):
        M.parse(3)


def test_names_and_str_round_trip():
    m = M.parse("audio+text")
    assert m.names() == ["text", "audio"] and M.parse(str(m)) == m


def test_text_joins_once_and_whole_is_stable():
    acc = OutputAccumulator()
    acc.add({"text": "Hel"})
    acc.add({"text": "lo"})
    assert acc.whole() == {"text": "Hello"}
    acc.add({"text": "!"})
    assert acc.get("text") == "Hello!"
    assert acc.whole() == {"text": "Hello!"}  # asking again does not join twice


def test_token_ids_and_latents_concat_dim0():
    acc = OutputAccumulator()
    acc.add({"token_ids": [1, 2], "latent": torch.ones(1, 3)})
    acc.add({"token_ids": [3], "latent": torch.zeros(2, 3)})
    whole = acc.whole()
    assert whole["token_ids"] == [1, 2, 3]
    assert torch.equal(whole["latent"], torch.cat([torch.ones(1, 3), torch.zeros(2, 3)]))
    acc.add({"token_ids": torch.tensor([4])})  # a tensor delta after lists
    assert acc.get("token_ids").tolist() == [1, 2, 3, 4]


def test_audio_concats_last_dim_video_concats_dim0_side_keys_keep_newest():
    acc = OutputAccumulator()
    acc.add({"audio": torch.zeros(1, 100), "sample_rate": 24000})
    acc.add({"audio": torch.ones(1, 50), "sample_rate": 16000})
    whole = acc.whole()
    assert whole["audio"].shape == (1, 150) and whole["sample_rate"] == 16000
    assert torch.equal(whole["audio"][:, 100:], torch.ones(1, 50))
    acc.add({"video": np.zeros((2, 4, 4, 3), np.uint8), "fps": 8})
    acc.add({"video": np.ones((3, 4, 4, 3), np.uint8)})
    assert acc.get("video").shape == (5, 4, 4, 3) and acc.get("video")[2:].min() == 1


def test_images_append_and_aux_keys_keep_a_lone_value_as_is():
    acc = OutputAccumulator()
    acc.add({"image": ["a"], "layout": {"k": 1}})
    acc.add({"image": ["b", "c"]})
    assert acc.get("image") == ["a", "b", "c"]
    assert acc.get("layout") == {"k": 1}
    acc.add({"layout": {"k": 2}})
    assert acc.get("layout") == [{"k": 1}, {"k": 2}]  # repeated aux values: a list of items


def test_family_rule_takes_precedence():
    keep_last = AccumulationRule(lambda parts: parts[-1])
    acc = OutputAccumulator({"text": keep_last})
    acc.add({"text": "a"})
    acc.add({"text": "b"})
    assert acc.whole() == {"text": "b"}


def test_normalize_keys_renames_generic_keeps_explicit_and_values():
    t = torch.randn(2, 3)
    aux = torch.randn(4)
    out = normalize_keys({"model_outputs": t, "codec_hidden": aux}, "latent")
    assert set(out) == {"latent", "codec_hidden"}
    assert out["latent"] is t and out["codec_hidden"] is aux  # values untouched
    assert set(normalize_keys({"hidden": t}, "audio")) == {"audio"}
    with pytest.raises(ValueError, match="name auxiliary outputs explicitly"):
        normalize_keys({"hidden": t, "latent": t}, "latent")


def test_normalize_keys_family_strategy_keeps_generic_key():
    rule = AccumulationRule(lambda parts: parts[-1])
    out = normalize_keys({"hidden": torch.ones(1)}, "latent", {"hidden": rule})
    assert set(out) == {"hidden"}


def test_action_names_round_trip_in_declaration_order():
    m = M.parse("action+audio+video")
    assert str(m) == "audio+video+action" and M.parse(str(m)) == m


def test_action_chunks_join_in_time_and_domain_and_rate_keep_newest():
    acc = OutputAccumulator()
    acc.add({"action": torch.zeros(3, 9), "action_domain": "av", "action_fps": 6.0})
    acc.add({"action": torch.ones(2, 9), "action_fps": 6.0})
    whole = acc.whole()
    assert whole["action"].shape == (5, 9) and whole["action"][3:].min() == 1
    assert whole["action_domain"] == "av" and whole["action_fps"] == 6.0


def test_final_output_carries_actions_as_a_float_tensor_only_when_asked():
    from omnistage.outputs import final_output

    whole = {
        "video": np.zeros((2, 4, 4, 3), np.uint8),
        "fps": 24.0,
        "action": np.arange(18, dtype=np.float64).reshape(2, 9),
        "action_domain": "av",
        "action_fps": 6.0,
    }
    common = dict(request_id="r", stage_id=0, output_type=M.parse("video+action"), metrics={}, finish_reason=None)
    out = final_output(whole=whole, keep=M.VIDEO | M.ACTION, num_tokens=None, progress=None, **common)
    assert isinstance(out.actions, torch.Tensor) and out.actions.dtype == torch.float32
    assert out.actions.tolist() == whole["action"].tolist()
    assert (out.action_domain, out.action_fps) == ("av", 6.0)
    assert out.modalities == ["video", "action"]
    video_only = final_output(whole=whole, keep=M.VIDEO, num_tokens=None, progress=None, **common)
    assert video_only.actions is None and video_only.action_domain is None


def test_final_output_refuses_an_action_payload_that_is_not_steps_by_width():
    from omnistage.outputs import final_output

    with pytest.raises(ValueError, match="steps, action width"):
        final_output(
            request_id="r",
            stage_id=0,
            output_type=M.ACTION,
            whole={"action": np.zeros(9)},
            keep=M.ACTION,
            metrics={},
            finish_reason=None,
            num_tokens=None,
            progress=None,
        )


def test_action_is_no_llm_stage_output():
    """A deploy asking an llm stage for actions fails at start-up, like any modality it cannot make."""
    from omnistage.stages.llm.args import PRODUCIBLE

    assert not M.ACTION & PRODUCIBLE
