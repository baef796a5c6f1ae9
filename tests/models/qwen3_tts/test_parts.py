"""Qwen3-TTS's parts without the orchestrator, against ``qwen-tts`` 0.1.1's goldens (conftest.py says how
they are made): the talker stage's greedy codes for every mode (preset voice, instruct, dialect speaker,
streamed text, voice design, in-context clone, x-vector clone), solo and as concurrent mixed requests
sharing steps; the speech tokenizer's decoder, encoder and the speaker encoder; streamed decode == whole."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistage.config.schema import StageDeployConfig
from omnistage.errors import InvalidRequestError
from omnistage.models.qwen3_tts import PIPELINE
from omnistage.models.qwen3_tts.config import checkpoint_defaults, folder_info, parse_params
from omnistage.models.qwen3_tts.engine import Qwen3TTSEngine
from omnistage.models.qwen3_tts.speech_decoder import SpeechTokenizerDecoder, decoder_adapter
from omnistage.models.qwen3_tts.speech_encoder import MimiEncoder, XVectorExtractor
from omnistage.pipeline import StageContext, get_pipeline, resolve_pipeline
from omnistage.stages.generation.engine import GenerationItem
from omnistage.testing.streams import all_outputs, stage_request
from tests.models.qwen3_tts.conftest import CASES, GOLDEN, GREEDY, REF_CLIP, golden, names, prompt_of

torch.set_num_threads(1)


def context(folder, stage_id: int) -> StageContext:
    return StageContext(get_pipeline("qwen3_tts").stage(stage_id), StageDeployConfig(stage_id=stage_id), str(folder))


def run_talker(folder, requests):
    """[(request id, prompt, params)] concurrently on one talker engine -> (outputs per request, batch sizes)."""

    async def main():
        engine = Qwen3TTSEngine(context(folder, 0))
        await engine.start()
        try:
            outs = await asyncio.gather(
                *(all_outputs(engine.generate(stage_request(rid, prompt, params))) for rid, prompt, params in requests)
            )
            return outs, list(engine.batch_sizes)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


def frames_of(outputs) -> np.ndarray:
    assert outputs[-1].finished and outputs[-1].error is None, outputs[-1]
    return torch.cat([o.data["token_ids"] for o in outputs if o.data.get("token_ids") is not None]).numpy()


def test_tiny_folders_resolve_with_their_voices(tiny):
    for _kind, folder in tiny.items():
        assert resolve_pipeline(folder).name == "qwen3_tts"
    declared = PIPELINE.info
    info = folder_info(tiny["custom_voice"], declared).speech
    assert info.voices == ("dylan", "ryan", "vivian") and not info.supports_voice_cloning
    assert "auto" in info.languages and "beijing_dialect" not in info.languages
    assert folder_info(tiny["base"], declared).speech.supports_voice_cloning
    assert folder_info(tiny["voice_design"], declared).speech.voices == ()
    assert checkpoint_defaults(tiny["base"])["temperature"] == 0.9  # the released generation_config.json


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design", "base", "custom_voice_0b6"])
def test_greedy_codes_equal_the_reference_solo_and_batched(tiny, kind):
    cases = names(kind)
    solo, _ = run_talker(tiny[kind], [(n, prompt_of(n), GREEDY) for n in cases])  # one engine, all at once
    # each case twice more, all concurrently (eight mixed requests for CustomVoice), sharing batched steps
    mixed = [(f"{n}-{i}", prompt_of(n), GREEDY) for i in range(2) for n in cases]
    batched, sizes = run_talker(tiny[kind], mixed)
    for n, outs in zip(cases, solo):
        assert np.array_equal(frames_of(outs), golden(n)["codes"]), n
    for (rid, _, _), outs in zip(mixed, batched):
        assert np.array_equal(frames_of(outs), golden(rid.rsplit("-", 1)[0])["codes"]), rid
    assert max(sizes) == len(mixed)  # every request ran in the same batched steps


def test_clone_prompt_parts_equal_the_reference(tiny):
    ref = np.load(GOLDEN / "clone_prompt.npz")
    codes = MimiEncoder(tiny["base"] / "speech_tokenizer").encode(REF_CLIP).numpy()
    assert np.array_equal(codes, ref["ref_code"])
    xvec = XVectorExtractor(tiny["base"])(REF_CLIP).numpy()
    assert np.abs(xvec - ref["spk_embedding"]).max() <= 1e-5


@pytest.mark.parametrize("name", list(CASES))
def test_decoder_waveform_equals_the_reference(tiny, name):
    g = golden(name)
    decoder = SpeechTokenizerDecoder(tiny[CASES[name]["kind"]] / "speech_tokenizer")
    codes = torch.from_numpy(g["codes"]).T
    cut = 0
    if name == "vc_icl":  # the reference decodes reference + generated codes and cuts the reference's samples
        ref_codes = torch.from_numpy(np.load(GOLDEN / "clone_prompt.npz")["ref_code"]).T
        codes, cut = torch.cat([ref_codes, codes], dim=1), ref_codes.shape[1] * 1920
    audio = decoder.decode(codes[None])[0, cut:].numpy()
    assert audio.shape == g["wav"].shape and np.abs(audio - g["wav"]).max() <= 1e-4
    assert int(g["sr"]) == decoder.sample_rate == 24000


def test_streamed_decode_equals_the_whole_decode(tiny):
    """Pieces of 1, 2, 3 ... frames (and an in-context clone's reference codes in front) decoded statefully
    (per request: the attention window, every causal convolution's last inputs), two requests sharing each
    call: the same samples as one decode of everything."""
    rng = np.random.default_rng(0)
    codes = torch.from_numpy(rng.integers(0, 64, size=(4, 200)))
    context = torch.from_numpy(rng.integers(0, 64, size=(4, 13)))
    adapter = decoder_adapter(context_for(tiny))
    assert adapter.codec.receptive_frames == 155  # 2 layers x 71 frames of attention window + convolutions
    assert adapter.context == 0  # stateful: no frame is decoded twice
    whole = adapter.codec.decode(torch.cat([context, codes], dim=1)[None])[0, 13 * 1920 :]
    plain = adapter.codec.decode(codes[None])[0]
    states, pieces, start, size = ({}, {}), ([], []), 0, 1
    while start < codes.shape[1]:
        end = min(start + size, codes.shape[1])
        items = [
            GenerationItem(
                rid,
                {
                    "codes": codes[:, start:end],
                    "streamed": True,
                    **({"context": context} if start == 0 and rid == "clone" else {}),
                },
                {},
                states[j],
                end == codes.shape[1],
            )
            for j, rid in enumerate(("clone", "plain"))
        ]
        for j, out in enumerate(adapter.run(items)):
            pieces[j].append(out["audio"])
        start, size = end, size + 1
    # the first pieces differ in length (the clone's carries its 13 reference frames), then both share each call
    assert adapter.calls[:2] == [1, 1] and set(adapter.calls[2:]) == {2}
    for streamed, ref in zip(pieces, (whole, plain)):
        streamed = torch.cat(streamed)
        assert streamed.shape == ref.shape and (streamed - ref).abs().max().item() <= 1e-5


def context_for(tiny) -> StageContext:
    return context(tiny["custom_voice"], 1)


@pytest.mark.parametrize(
    "kind, info, field",
    [
        ("custom_voice", {"voice": "bob"}, "voice"),
        ("custom_voice", {"language": "klingon"}, "language"),
        ("custom_voice", {"ref_audio": (REF_CLIP, 24000), "ref_text": "x"}, "ref_audio"),
        ("custom_voice", {"ref_text": "no clip"}, "ref_text"),
        ("voice_design", {"voice": "vivian"}, "voice"),
        ("custom_voice_0b6", {"voice": "vivian", "instructions": "loud"}, "instructions"),  # qwen-tts drops it silently
        ("base", {}, "ref_audio"),
        ("base", {"ref_audio": (REF_CLIP, 24000)}, "ref_text"),
        ("base", {"ref_audio": ([], 24000), "ref_text": "x"}, "ref_audio"),
        ("base", {"ref_audio": (REF_CLIP[:500], 24000), "ref_text": "x"}, "ref_audio"),  # too short to encode
        ("base", {"ref_audio": (REF_CLIP, 24000), "ref_text": "x", "instructions": "loud"}, "instructions"),
        ("base", {"ref_audio": (REF_CLIP, 24000), "x_vector_only_mode": "yes"}, "x_vector_only_mode"),
    ],
)
def test_bad_input_names_the_field(tiny, kind, info, field):
    async def main():
        engine = Qwen3TTSEngine(context(tiny[kind], 0))
        await engine.start()
        try:
            with pytest.raises(InvalidRequestError) as e:
                await all_outputs(engine.generate(stage_request("bad", {"prompt": "hi", "speech": info}, GREEDY)))
            return e.value
        finally:
            await engine.shutdown()

    error = asyncio.run(main())
    assert error.field == field
    if field == "voice" and kind == "custom_voice":
        assert "dylan, ryan, vivian" in str(error)  # the 400 lists the voices


def test_params_are_checked_and_temperature_zero_is_greedy_everywhere(tiny):
    defaults = checkpoint_defaults(tiny["custom_voice"])
    p = parse_params({"temperature": 0}, defaults)
    assert p.talker.temperature == 0 and p.sub.temperature == 0
    assert parse_params({"temperature": 0, "subtalker_temperature": 0.5}, defaults).sub.temperature == 0.5
    assert p.min_tokens == 2 and parse_params({"min_tokens": 9}, defaults).min_tokens == 9  # the package's floor: 2
    for bad, field in [
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["x"]}, "stop"),
        ({"seed": -1}, "seed"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"subtalker_top_k": 1.5}, "subtalker_top_k"),
    ]:
        with pytest.raises(InvalidRequestError) as e:
            parse_params(bad, defaults)
        assert e.value.field == field


def test_min_tokens_holds_off_the_end_of_speech(tiny):
    """The streamed-text case ends after 3 frames in the reference; with min_tokens the talker goes on, its
    first frames unchanged."""
    name = "cv_vivian_streamtext"
    (outs,), _ = run_talker(tiny["custom_voice"], [(name, prompt_of(name), {**GREEDY, "min_tokens": 12})])
    frames, ref = frames_of(outs), golden(name)["codes"]
    assert ref.shape[0] == 3 and frames.shape[0] == 11 and np.array_equal(frames[:3], ref)
