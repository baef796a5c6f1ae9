"""codec_tts without vLLM: omnistage.json checks, the token -> codes edge, and the
streamed, batched codec decode against transformers' ``MimiModel.decode`` of the
whole code sequence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.config import load_tts_config
from omnistage.models.shared.codec_lm.edges import LAYOUT_KEY, codes_every_n_frames, tokens_to_codes, whole_codes
from omnistage.pipeline import StageContext, get_pipeline
from omnistage.stages.generation.engine import GenerationItem

# Streamed vs whole decode: the same float32 ops over different lengths round differently
# (measured max |diff| <= 8.4e-7 over 5 seeds, audio peak ~2.5); the bound leaves 10x room and is far
# below what a wrong context gives (> 1e-2, checked below).
TOL = 1e-5
LAYOUT = {
    "codec_token_offset": 100,
    "codebook_size": 4,
    "num_quantizers": 2,
    "layout": "shared",
    "end_id": 7,
    "chunk_frames": 2,
}


class Req:  # the two request fields the edge reads
    def __init__(self, stage1_params=None):
        self.sampling_params = [{}, stage1_params or {}]


# ----------------------------------------------------------------------------- config


def write_meta(tmp_path: Path, **over) -> Path:
    meta = {
        "pipeline": "codec_tts",
        "voices": {"a": "a: "},
        "codec_token_offset": 10,
        "codebook_size": 4,
        "num_quantizers": 2,
        **over,
    }
    (tmp_path / "omnistage.json").write_text(json.dumps(meta))
    return tmp_path


@pytest.mark.parametrize(
    "over, field",
    [
        ({"prompt_template": "no placeholder"}, "prompt_template"),
        ({"prompt_template": "{text} {speaker}"}, "prompt_template"),
        ({"layout": "interleaved"}, "layout"),
        ({"chunk_frames": 0}, "chunk_frames"),
        ({"default_voice": "zed"}, "default_voice"),
        ({"codebook_size": "4"}, "codebook_size"),
        ({"decode_context_frames": -1}, "decode_context_frames"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_omnistage_json_names_the_key(tmp_path, over, field):
    with pytest.raises(ValueError, match=field):
        load_tts_config(write_meta(tmp_path, **over))


def test_voice_prefixes(tmp_path):
    cfg = load_tts_config(write_meta(tmp_path, default_voice="a"))
    assert cfg.voice_prefix(None) == "a: " and cfg.voice_prefix("a") == "a: "
    with pytest.raises(ValueError, match="voice: 'b' is not one of a"):
        cfg.voice_prefix("b")


def test_folder_info_lists_voices_and_rate(tts_dir):
    info = get_pipeline("codec_tts").for_model(tts_dir).info
    assert info.speech.voices == ("alto", "bass") and info.speech.sample_rate == 16000
    assert info.speech.supports_speed is False
    assert get_pipeline("codec_tts").info.speech.voices == ()  # the registered pipeline is not modified


# ----------------------------------------------------------------------------- edge


def test_tokens_to_codes_frame_major_and_layouts():
    ids = [100, 103, 101, 102]  # frame 0: (0, 3), frame 1: (1, 2)
    assert tokens_to_codes(ids, LAYOUT).tolist() == [[0, 1], [3, 2]]
    per = {**LAYOUT, "layout": "per_codebook"}
    assert tokens_to_codes([100, 107, 101, 104], per).tolist() == [[0, 1], [3, 0]]
    with pytest.raises(
        ValueError, match=r"token_ids\[1\]: 103 is not a codec token of codebook 1 \(expected 104..107\)"
    ):
        tokens_to_codes([100, 103], per)
    with pytest.raises(ValueError, match=r"token_ids\[6\]: 5 is not a codec token"):
        tokens_to_codes([5, 100], LAYOUT, start=6)


def test_streaming_edge_sends_whole_chunks_then_the_tail():
    f, state, req = codes_every_n_frames, {"finished": False}, Req()
    assert f({"token_ids": [100, 101, 102]}, req, state) is None  # nothing is sent before the layout arrives
    state = {"finished": False}
    assert f({LAYOUT_KEY: LAYOUT, "token_ids": [100, 101, 102]}, req, state) is None  # 1.5 frames < first chunk
    out = f({"token_ids": [103, 100, 100, 101]}, req, state)  # 3.5 frames: the first piece takes every whole one
    assert out["codes"].tolist() == [[0, 2, 0], [1, 3, 0]] and out["streamed"]
    assert f({"token_ids": [102, 103]}, req, state) is None  # 1.5 frames < chunk_frames (2)
    assert f({"token_ids": [100]}, req, state)["codes"].tolist() == [[1, 3], [2, 0]]  # a whole chunk
    assert f({"token_ids": [101, 102, 7, 100]}, req, state) is None  # the end token and what follows are dropped
    state["finished"] = True
    assert f({}, req, state)["codes"].tolist() == [[1], [2]]  # the tail
    assert f({}, req, state) is None


def test_first_piece_waits_for_initial_chunk_plus_lookahead_and_carries_the_context():
    layout = {**LAYOUT, "initial_chunk_frames": 1, "lookahead_frames": 2, "context_codes": [[3, 3], [1, 0]]}
    state = {"finished": False}
    assert codes_every_n_frames({LAYOUT_KEY: layout, "token_ids": [100] * 4}, Req(), state) is None  # 2 < 1 + 2
    out = codes_every_n_frames({"token_ids": [101, 101]}, Req(), state)
    assert out["codes"].shape == (2, 3) and out["context"].tolist() == [[3, 3], [1, 0]]
    out = codes_every_n_frames({"token_ids": [100] * 4}, Req(), state)
    assert out["codes"].shape == (2, 2) and "context" not in out  # the reference codes go once
    # a per-request first chunk (stage 1 params) wins over the folder's
    state = {"finished": False}
    out = codes_every_n_frames(
        {LAYOUT_KEY: layout, "token_ids": [100] * 8}, Req({"initial_codec_chunk_frames": 4}), state
    )
    assert out is None


def test_no_whole_frame_is_an_error_naming_the_input_not_silence():
    state = {"finished": False}
    assert codes_every_n_frames({LAYOUT_KEY: LAYOUT, "token_ids": [100, 7]}, Req(), state) is None
    state["finished"] = True
    with pytest.raises(InvalidRequestError, match="no complete codec frame") as e:
        codes_every_n_frames({}, Req(), state)
    assert e.value.field == "input"
    with pytest.raises(InvalidRequestError, match="no complete codec frame"):
        whole_codes({LAYOUT_KEY: LAYOUT, "token_ids": [7]}, Req())


def test_streaming_edge_chunk_size_per_request_and_bad_token_position():
    state = {"finished": False}
    out = codes_every_n_frames({LAYOUT_KEY: LAYOUT, "token_ids": [100] * 6}, Req({"chunk_frames": 3}), state)
    assert out["codes"].shape == (2, 3)
    with pytest.raises(ValueError, match=r"token_ids\[7\]: 50 is not a codec token"):
        codes_every_n_frames({"token_ids": [100, 50] * 3}, Req({"chunk_frames": 3}), state)


def test_whole_codes_matches_streamed_concatenation():
    ids = [100 + (i * 5) % 4 for i in range(14)] + [7, 101]
    whole = whole_codes({LAYOUT_KEY: LAYOUT, "token_ids": ids}, Req())["codes"]
    state, parts = {"finished": False}, []
    for i in range(0, len(ids), 3):
        out = codes_every_n_frames(
            {**({LAYOUT_KEY: LAYOUT} if i == 0 else {}), "token_ids": ids[i : i + 3]}, Req(), state
        )
        parts += [out["codes"]] if out else []
    state["finished"] = True
    tail = codes_every_n_frames({}, Req(), state)
    parts += [tail["codes"]] if tail else []
    assert torch.equal(torch.cat(parts, dim=1), whole) and whole.shape == (2, 7)


# ----------------------------------------------------------------------------- codec decode


@pytest.fixture(scope="module")
def adapter(tts_dir):
    from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter

    spec = get_pipeline("codec_tts").stage(1)
    return CodecDecoderAdapter(StageContext(spec=spec, deploy=StageDeployConfig(stage_id=1), model=str(tts_dir)))


@pytest.fixture(scope="module")
def mimi(tts_dir):
    from transformers import MimiModel

    return MimiModel.from_pretrained(str(tts_dir / "codec")).eval()


def reference(mimi, codes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return mimi.decode(codes[None]).audio_values[0, 0]


def stream(adapter, codes: torch.Tensor, sizes: list[int], state=None) -> torch.Tensor:
    state, parts, start = {} if state is None else state, [], 0
    for i, n in enumerate(sizes):
        last = i == len(sizes) - 1
        (out,) = adapter.run([GenerationItem("r", {"codes": codes[:, start : start + n]}, {}, state, last)])
        assert not isinstance(out, Exception), out
        parts.append(out["audio"])
        assert out["sample_rate"] == 16000 and out["audio"].shape == (n * 320,)
        start += n
    return torch.cat(parts)


def test_streamed_decode_equals_whole_decode(adapter, mimi):
    torch.manual_seed(1)
    codes = torch.randint(0, 32, (2, 60))
    ref = reference(mimi, codes)
    sizes = [4, 4, 1, 7, 4, 4, 16, 20]  # uneven pieces, longer than the context in the middle and at the end
    got = stream(adapter, codes, sizes)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() <= TOL
    assert adapter.context == adapter.codec.receptive_frames < 60  # the context really is bounded


def test_receptive_field_bound_holds_and_matters(adapter, mimi):
    """The computed bound covers how far a code really reaches, and a shorter context breaks equality."""
    torch.manual_seed(2)
    codes = torch.randint(0, 32, (2, 50))
    ref = reference(mimi, codes)
    changed = codes.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 32
    diff = (reference(mimi, changed) - ref).abs()
    reach = int(diff.gt(1e-4).nonzero().max()) // 320 - 10
    assert 2 <= reach <= adapter.codec.receptive_frames
    saved = adapter.context
    try:
        adapter.context = 2
        assert (stream(adapter, codes, [5] * 10) - ref).abs().max().item() > 1e-2
    finally:
        adapter.context = saved


def test_batched_requests_equal_their_solo_runs(adapter):
    torch.manual_seed(3)
    a, b = torch.randint(0, 32, (2, 30)), torch.randint(0, 32, (2, 12))
    solo_a, solo_b = stream(adapter, a, [10, 10, 10]), stream(adapter, b, [5, 7])
    sa, sb = {}, {}
    calls = len(adapter.calls)
    pieces = [((0, 10), (0, 5), False), ((10, 20), (5, 12), True)]  # a's first two pieces batched with b's
    got_a, got_b = [], []
    for (a0, a1), (b0, b1), b_last in pieces:
        oa, ob = adapter.run(
            [
                GenerationItem("a", {"codes": a[:, a0:a1]}, {}, sa, False),
                GenerationItem("b", {"codes": b[:, b0:b1]}, {}, sb, b_last),
            ]
        )
        got_a.append(oa["audio"])
        got_b.append(ob["audio"])
    (oa,) = adapter.run([GenerationItem("a", {"codes": a[:, 20:]}, {}, sa, True)])
    got_a.append(oa["audio"])
    assert adapter.calls[calls:] == [2, 2, 1]
    assert (torch.cat(got_a) - solo_a).abs().max().item() <= TOL
    assert (torch.cat(got_b) - solo_b).abs().max().item() <= TOL


def test_bad_items_fail_alone(adapter):
    ok = GenerationItem("ok", {"codes": torch.zeros(2, 3, dtype=torch.long)}, {}, {}, True)
    bad_range = GenerationItem("x", {"codes": torch.full((2, 3), 32)}, {}, {}, True)
    bad_shape = GenerationItem("y", {"codes": torch.zeros(3, 3, dtype=torch.long)}, {}, {}, True)
    bad_param = GenerationItem("z", {"codes": torch.zeros(2, 3, dtype=torch.long)}, {"chunk_frames": 0}, {}, True)
    unknown = GenerationItem("u", {"codes": torch.zeros(2, 3, dtype=torch.long)}, {"num_frames": 3}, {}, True)
    empty = GenerationItem("e", {}, {}, {}, True)
    out = adapter.run([ok, bad_range, bad_shape, bad_param, unknown, empty])
    assert out[0]["audio"].shape == (960,)
    assert isinstance(out[1], ValueError) and "codes: values must be in 0..31" in str(out[1])
    assert isinstance(out[2], ValueError) and "codes: expected an integer tensor [2, frames]" in str(out[2])
    assert isinstance(out[3], ValueError) and str(out[3]).startswith("chunk_frames:")
    assert isinstance(out[4], ValueError) and "num_frames" in str(out[4])
    assert out[5] == {}  # nothing to decode, nothing emitted
