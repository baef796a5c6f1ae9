"""codec_tts's XCodec2 pieces without vLLM: the streamed block schedule of a non-causal codec, the whole
decode with reference codes in front (against ``Xcodec2Model.decode``), the encoder's Kaldi features
(against kaldi-native-fbank, an independent Kaldi fbank) and resampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.models.shared.codec_lm.config import NON_CAUSAL_CONTEXT
from omnistage.pipeline import StageContext, get_pipeline
from omnistage.stages.generation.engine import GenerationItem
from omnistage.testing.requires import requires_module

BATCH_TOL = 1e-6  # the same window decoded in batches of different sizes (measured ~5e-8)


@pytest.fixture(scope="module")
def llasa_dir(tiny_model):
    return tiny_model("llasa")


@pytest.fixture(scope="module")
def adapter(llasa_dir):
    from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter

    torch.set_num_threads(1)
    spec = get_pipeline("codec_tts").stage(1)
    return CodecDecoderAdapter(StageContext(spec=spec, deploy=StageDeployConfig(stage_id=1), model=str(llasa_dir)))


@pytest.fixture(scope="module")
def xcodec2(llasa_dir):
    from transformers import Xcodec2Model

    return Xcodec2Model.from_pretrained(str(llasa_dir / "codec")).eval()


def feed(adapter, codes, sizes, params, context=None):
    state, parts, start = {}, [], 0
    for i, n in enumerate(sizes):
        inputs = {"codes": codes[:, start : start + n], "streamed": True}
        if i == 0 and context is not None:
            inputs["context"] = context
        (out,) = adapter.run([GenerationItem("r", inputs, params, state, i == len(sizes) - 1)])
        assert not isinstance(out, Exception), out
        parts += [out["audio"]] if out else []
        start += n
    return torch.cat(parts)


def test_defaults_for_a_non_causal_codec(adapter):
    assert adapter.codec.causal is False and (adapter.context, adapter.lookahead) == NON_CAUSAL_CONTEXT


def test_streamed_blocks_do_not_depend_on_how_pieces_arrive(adapter, xcodec2):
    torch.manual_seed(0)
    codes, context = torch.randint(0, 64, (1, 50)), torch.randint(0, 64, (1, 12))
    params = {"initial_codec_chunk_frames": 3, "chunk_frames": 8}
    a = feed(adapter, codes, [50], params, context)
    b = feed(adapter, codes, [1, 9, 2, 20, 18], params, context)
    c = feed(adapter, codes, [7] * 7 + [1], params, context)
    assert a.shape == b.shape == c.shape == (50 * 320,)
    assert (a - b).abs().max().item() <= BATCH_TOL and (a - c).abs().max().item() <= BATCH_TOL
    # and it is the schedule: block [0, 3) is decoded from the last 32 context frames to 3 + 4 frames
    with torch.no_grad():
        window = torch.cat([context, codes[:, :7]], dim=1)
        first = xcodec2.decode(audio_codes=window[None]).audio_values[0, 0, 12 * 320 : 15 * 320]
    assert (a[: 3 * 320] - first).abs().max().item() <= BATCH_TOL


def test_whole_sequence_with_context_equals_the_codec_decode(adapter, xcodec2):
    torch.manual_seed(1)
    codes, context = torch.randint(0, 64, (1, 40)), torch.randint(0, 64, (1, 25))
    (out,) = adapter.run([GenerationItem("w", {"codes": codes, "context": context}, {}, {}, True)])
    with torch.no_grad():
        ref = xcodec2.decode(audio_codes=torch.cat([context, codes], 1)[None]).audio_values[0, 0, 25 * 320 :]
    assert out["audio"].shape == ref.shape and (out["audio"] - ref).abs().max().item() <= 1e-6
    # streamed, the same codes are an approximation: the context reaches the whole sequence
    streamed = feed(adapter, codes, [40], {"chunk_frames": 8}, context)
    assert (streamed - ref).abs().max().item() > 1e-3


def test_windows_of_different_lengths_are_never_padded_together(adapter):
    """Padding changes an XCodec2 decode (GroupNorm over time, unmasked attention): batches hold one length."""
    torch.manual_seed(2)
    a, b = torch.randint(0, 64, (1, 20)), torch.randint(0, 64, (1, 9))
    solo_b = adapter.run([GenerationItem("b", {"codes": b}, {}, {}, True)])[0]["audio"]
    calls = len(adapter.calls)
    out = adapter.run(
        [GenerationItem("a", {"codes": a}, {}, {}, True), GenerationItem("b", {"codes": b}, {}, {}, True)]
    )
    assert adapter.calls[calls:] == [1, 1]
    assert (out[1]["audio"] - solo_b).abs().max().item() <= BATCH_TOL


@requires_module("kaldi_native_fbank")
def test_encoder_features_are_kaldi_fbank(adapter):
    import kaldi_native_fbank as knf

    rng = np.random.default_rng(0)
    audio = (0.3 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440) + 0.05 * rng.standard_normal(16000)).astype(
        np.float32
    )
    values, feats, mask = adapter.codec.features(audio)
    assert values.shape == (1, 1, 16320) and feats.shape == (1, 51, 160) and mask.tolist() == [[1] * 51]
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.window_type = "povey"
    opts.mel_opts.num_bins = 80
    opts.mel_opts.low_freq = 20
    opts.mel_opts.high_freq = 8000
    fbank = knf.OnlineFbank(opts)
    wave = np.pad(values.numpy().reshape(-1), (160, 160)) * 2**15
    fbank.accept_waveform(16000, wave.tolist())
    fbank.input_finished()
    ref = torch.tensor(np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]))
    ref = (ref - ref.mean(0)) / torch.sqrt(ref.var(0, unbiased=True) + 1e-7)
    got = feats.reshape(-1, 80)[: ref.shape[0]]
    # normalised units (std 1); measured 3.9e-5 (float32 vs float64 arithmetic)
    assert ref.shape[0] == 102 and (got - ref).abs().max().item() < 1e-3


def test_resample_keeps_length_and_pitch():
    from omnistage.media_intake import resample  # what the codec LM resamples reference clips with

    t = np.arange(24000) / 24000
    out = resample(np.sin(2 * np.pi * 1000 * t).astype(np.float32), 24000, 16000)
    assert abs(len(out) - 16000) <= 16
    spectrum = np.abs(np.fft.rfft(out[:16000] if len(out) >= 16000 else np.pad(out, (0, 16000 - len(out)))))
    assert abs(int(spectrum.argmax()) - 1000) <= 1


async def test_the_tail_is_decoded_when_the_end_comes_after_the_last_piece_ran(adapter, llasa_dir):
    """The engine, not the adapter alone: the LM's last frames reach the codec in a piece that runs before the
    orchestrator says "no more input" (it does once the LM stage finishes, with an empty last chunk when the
    edge had nothing left). The held-back last block (it waits for a lookahead that never comes) must still be
    decoded: the whole length arrives, equal to feeding the same piece marked last."""
    import asyncio

    from omnistage.stages.base import StageRequest
    from omnistage.stages.generation.engine import GenerationStageEngine

    torch.manual_seed(3)
    codes = torch.randint(0, 64, (1, 20))
    params = {"initial_codec_chunk_frames": 2, "chunk_frames": 8}
    ctx = StageContext(
        spec=get_pipeline("codec_tts").stage(1), deploy=StageDeployConfig(stage_id=1), model=str(llasa_dir)
    )
    engine = GenerationStageEngine(ctx, adapter)
    await engine.start()
    try:
        req = StageRequest("tail", {"codes": codes, "streamed": True}, params, stream_inputs=True)
        outs = engine.generate(req)
        first = await asyncio.wait_for(outs.__anext__(), 30)  # the piece ran (blocks [0, 2), [2, 10))
        await engine.feed("tail", {}, last=True)
        parts = [first.data["audio"]] + [o.data["audio"] async for o in outs if o.data.get("audio") is not None]
    finally:
        await engine.shutdown()
    got = torch.cat(parts)
    want = feed(adapter, codes, [20], params)  # the same piece, marked last
    assert got.shape == want.shape == (20 * 320,)
    assert (got - want).abs().max().item() <= BATCH_TOL
