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
    ],
)
def test_parse_rejects_with_value_and_canonical_names(value):
    with pytest.raises(ValueError) as e:
        M.parse(value)
    msg = str(e.value)
    assert repr(value) in msg
    for name in ("text", "image", "audio", "video", "latent", "token_ids"):
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
