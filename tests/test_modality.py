import numpy as np
import pytest
import torch

from omnistage.modality import AccumulationRule, OutputAccumulator, OutputModality, normalize_keys

M = OutputModality


@pytest.mark.parametrize("value, expected", [
    (None, M.TEXT),
    ("text", M.TEXT),
    ("text+audio", M.TEXT | M.AUDIO),
    ("image,latent", M.IMAGE | M.LATENT),
    ("token_ids", M.TOKEN_IDS),
    ("video", M.VIDEO),
])
def test_parse_accepts_canonical(value, expected):
    assert M.parse(value) == expected


def test_token_ids_is_its_own_modality():
    assert M.parse("token_ids") != M.TEXT and not (M.parse("token_ids") & M.TEXT)


@pytest.mark.parametrize("value", ["", "text+", "latents", "tokens", "speech", "wav", "img", "Text", " text",
                                   "text + audio", "foo", "+text", "text,,audio"])
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


def test_text_appends_and_drains():
    acc = OutputAccumulator()
    acc.add({"text": "Hel"})
    assert acc.take() == {"text": "Hel"}
    acc.add({"text": "lo"})
    acc.add({"text": "!"})
    assert acc.take() == {"text": "lo!"}
    assert acc.take() == {}
    assert acc.total["text"] == "Hello!"


def test_token_ids_and_latent_are_never_drained():
    acc = OutputAccumulator()
    acc.add({"token_ids": [1, 2], "latent": torch.ones(1, 3)})
    first = acc.take()
    assert first["token_ids"] == [1, 2]
    acc.add({"token_ids": [3], "latent": torch.zeros(2, 3)})
    second = acc.take()
    assert second["token_ids"] == [1, 2, 3]  # the full context, every time
    assert second["latent"].shape == (3, 3)
    acc.add({"token_ids": torch.tensor([4])})
    assert acc.take()["token_ids"].tolist() == [1, 2, 3, 4]


def test_audio_concats_last_dim_and_drains_video_concats_dim0():
    acc = OutputAccumulator()
    acc.add({"audio": torch.zeros(1, 100), "sample_rate": 24000})
    acc.add({"audio": torch.ones(1, 50), "sample_rate": 24000})
    taken = acc.take()
    assert taken["audio"].shape == (1, 150) and taken["sample_rate"] == 24000
    acc.add({"audio": torch.ones(1, 10)})
    assert acc.take()["audio"].shape == (1, 10)  # drained: only the new samples
    assert acc.total["audio"].shape == (1, 160)
    acc.add({"video": np.zeros((2, 4, 4, 3), np.uint8), "fps": 8})
    acc.add({"video": np.zeros((3, 4, 4, 3), np.uint8)})
    assert acc.take()["video"].shape == (5, 4, 4, 3)


def test_images_append():
    acc = OutputAccumulator()
    acc.add({"image": ["a"]})
    acc.add({"image": ["b", "c"]})
    assert acc.take()["image"] == ["a", "b", "c"]


def test_family_rule_takes_precedence():
    keep_last = AccumulationRule(lambda old, new: new, drain=False)
    acc = OutputAccumulator({"text": keep_last})
    acc.add({"text": "a"})
    acc.add({"text": "b"})
    assert acc.take() == {"text": "b"} and acc.take() == {"text": "b"}


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
    rule = AccumulationRule(lambda o, n: n, drain=False)
    out = normalize_keys({"hidden": torch.ones(1)}, "latent", {"hidden": rule})
    assert set(out) == {"hidden"}
