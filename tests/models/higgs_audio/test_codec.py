"""Higgs Audio's decoder stage (``HiggsCodecAdapter``) against transformers' ``HiggsAudioV2TokenizerModel.decode``
(golden: see conftest): the whole decode, streamed pieces of several requests batched, streamed == whole."""

from __future__ import annotations

import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.models.higgs_audio.codec import HiggsCodecAdapter
from omnistage.pipeline import StageContext, get_pipeline
from omnistage.stages.generation.engine import GenerationItem
from tests.models.higgs_audio.conftest import golden

torch.set_num_threads(1)

TOL = 1e-6  # measured 0.0 for the whole decode (the reference's own modules and order); blocks: 2.8e-9 rounding


def adapter(folder) -> HiggsCodecAdapter:
    return HiggsCodecAdapter(
        StageContext(get_pipeline("higgs_audio").stage(1), StageDeployConfig(stage_id=1), str(folder))
    )


def test_whole_decode_equals_the_reference_tokenizer(higgs_dir):
    ref = golden("decode")
    codes = torch.from_numpy(ref["codes"])
    out = adapter(higgs_dir).run([GenerationItem("a", {"codes": codes}, {}, {}, True)])[0]
    wav = torch.from_numpy(ref["wav"])
    assert out["sample_rate"] == 24000 and out["audio"].shape == wav.shape == (40 * 960,)
    assert (out["audio"] - wav).abs().max().item() <= TOL
    assert wav.abs().max() > 1e-3  # real signal, not silence


def test_streamed_pieces_equal_the_whole_decode(higgs_dir):
    """Pieces of 2, 8, 8, ... frames as the edge sends them (blocks wait for the decoder's receptive field of
    lookahead), a second request's whole decode in the same calls."""
    a = adapter(higgs_dir)
    assert a.context == a.lookahead == a.codec.receptive_frames == 13
    ref = golden("decode")
    codes = torch.from_numpy(ref["codes"])
    cuts = [0, 2, 10, 18, 26, 34, 40]
    state: dict = {}
    got = []
    for j in range(len(cuts) - 1):
        last = j == len(cuts) - 2
        items = [GenerationItem("a", {"codes": codes[:, cuts[j] : cuts[j + 1]], "streamed": True}, {}, state, last)]
        if j == 0:
            items.append(GenerationItem("b", {"codes": codes[:, :20]}, {}, {}, True))
        results = a.run(items)
        if results[0].get("audio") is not None:
            got.append(results[0]["audio"])
        if j == 0:
            whole_b = results[1]["audio"]
    streamed = torch.cat(got)
    wav = torch.from_numpy(ref["wav"])
    assert len(got) > 2  # it streamed in several pieces
    assert streamed.shape == wav.shape
    assert (streamed - wav).abs().max().item() <= TOL
    whole_20 = a.run([GenerationItem("c", {"codes": codes[:, :20]}, {}, {}, True)])[0]["audio"]
    assert torch.equal(whole_b, whole_20)
