"""Higgs Audio's decoder stage (``HiggsCodecAdapter``) against transformers' ``HiggsAudioV2TokenizerModel.decode``
(golden: see conftest): the whole decode, streamed pieces of several requests batched, streamed == whole."""

from __future__ import annotations

import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.models.higgs_audio.codec import HiggsCodecAdapter
from omnistage.models.higgs_audio.config import LOOKAHEAD_FRAMES
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
    """Pieces as the edge sends them (the first 2 frames with the decoder's lookahead, then 8 at a time; a
    block waits for the decoder's receptive field of lookahead), a second request's whole decode in the same
    calls."""
    a = adapter(higgs_dir)
    assert a.context == a.lookahead == a.codec.receptive_frames == LOOKAHEAD_FRAMES == 10
    ref = golden("decode")
    codes = torch.from_numpy(ref["codes"])
    cuts = [0, 2 + LOOKAHEAD_FRAMES, 20, 28, 36, 40]
    state: dict = {}
    got = []
    for j in range(len(cuts) - 1):
        last = j == len(cuts) - 2
        items = [GenerationItem("a", {"codes": codes[:, cuts[j] : cuts[j + 1]], "streamed": True}, {}, state, last)]
        if j == 0:
            items.append(GenerationItem("b", {"codes": codes[:, :20]}, {}, {}, True))
        results = a.run(items)
        if j == 0:  # the first piece carries its lookahead: the first block is decoded on arrival
            assert results[0]["audio"].shape == (2 * 960,)
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


def test_the_receptive_field_is_exact(higgs_dir):
    """Codes further than ``receptive_frames`` from a frame leave its samples bit for bit (the streamed blocks'
    context and lookahead are long enough); nearer codes change them. (Codes right at the edge reach the frame
    through the outermost taps only, below float32 resolution with these weights: the edge's tightness is the
    walk in ``dac_span``, not measured here.)"""
    codec = adapter(higgs_dir).codec
    r, spf = codec.receptive_frames, codec.samples_per_frame
    codes = torch.from_numpy(golden("decode")["codes"]).unsqueeze(0)  # [1, K, 40]
    f = 20  # the frame looked at
    base = codec.decode(codes)[0, f * spf : (f + 1) * spf]
    for at, changes in ((f - r - 1, False), (f + r + 1, False), (f - r // 2, True), (f + r // 2, True)):
        other = codes.clone()
        other[0, :, at] = (other[0, :, at] + 1) % codec.codebook_size
        assert torch.equal(codec.decode(other)[0, f * spf : (f + 1) * spf], base) is not changes, at


def test_a_span_decode_equals_the_window_decode(higgs_dir):
    """``decode_span`` (only the kept samples computed) against the window's whole decode, sliced: a first
    block, a middle block, a last block, two rows."""
    codec = adapter(higgs_dir).codec
    spf = codec.samples_per_frame
    codes = torch.from_numpy(golden("decode")["codes"])
    codes = torch.stack([codes, codes.flip(-1)])  # [2, K, 40]
    for lo, hi, keep_from, keep_to in ((0, 12, 0, 2), (0, 40, 0, 40), (3, 33, 13, 23), (25, 40, 10, 15)):
        window = codes[:, :, lo:hi]
        span = codec.decode_span(window, keep_from * spf, keep_to * spf)
        whole = codec.decode(window)[:, keep_from * spf : keep_to * spf]
        assert span.shape == whole.shape
        assert (span - whole).abs().max().item() <= TOL, (lo, hi)
