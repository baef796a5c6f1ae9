"""Every video family takes the frame counts its diffusers pipeline takes and returns exactly the frames that
pipeline returns for them, rounded as the pipeline rounds (Wan and Wan VACE to ``4k+1``, Helios to whole chunks of
33, the others by their VAE's temporal factor); a count the pipeline itself refuses is an error naming ``num_frames``.
Offline ``Omni`` on each tiny folder against the pipeline's ``__call__`` (same seed, one step, fp32 on the CPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from omnistage import Omni
from omnistage.errors import InvalidRequestError
from tests.stages.diffusion.helpers import gen, reference_pipeline

PROMPT = "a red cat"


@dataclass
class Case:
    pipeline: str  # diffusers' class: the reference
    counts: tuple[int, ...]  # asked-for counts, some the pipeline rounds
    size: tuple[int, int] = (32, 32)
    params: dict[str, Any] = field(default_factory=dict)  # ours and the reference's
    ref_params: dict[str, Any] = field(default_factory=dict)  # the reference's only (its names for ours)
    refused: tuple[int, ...] = ()  # counts the pipeline itself refuses
    ref_steps: dict[str, Any] = field(default_factory=lambda: {"num_inference_steps": 1})  # the reference's one step


SEQ = {"max_sequence_length": 16}
CASES = {
    # WanPipeline rounds a count that is not 4k+1 to (n // 4) * 4 + 1: 6 -> 5, 8 -> 9, 12 -> 13
    "wan": Case("WanPipeline", (6, 8, 12), size=(32, 48), params=SEQ),
    # Wan VACE rounds as Wan does (here with no source video: the pipeline's all-zero control video)
    "wan_vace": Case("WanVACEPipeline", (6, 8, 12), size=(32, 48), params=SEQ),
    # HunyuanVideo-1.5 and LTX-2 take the count as is; their VAEs decode (n - 1) // 4 (or 8) + 1 latent frames
    "hunyuan_video15": Case("HunyuanVideo15Pipeline", (7, 10)),
    "ltx2": Case("LTX2Pipeline", (12, 17), params=SEQ, ref_params={"frame_rate": 24.0}),
    "ltx23": Case("LTX2Pipeline", (12,), params=SEQ, ref_params={"frame_rate": 24.0}),
    # Helios makes whole chunks of 33 frames, trimmed to 4k+1: 9 -> 33, 34 -> 65
    "helios": Case("HeliosPipeline", (9, 34)),
    "helios_pyramid": Case(
        "HeliosPyramidPipeline", (9,), size=(64, 64), ref_steps={"pyramid_num_inference_steps_list": [1, 1, 1]}
    ),
    # Cosmos3 takes the count as is (one frame is text-to-image); it refuses a count under 1
    "cosmos3": Case("Cosmos3OmniPipeline", (2, 7), size=(32, 48), refused=(0,)),
}


def _reference(ref: Any, case: Case, n: int) -> Any:
    h, w = case.size
    out = ref(
        PROMPT,
        generator=gen(3),
        height=h,
        width=w,
        num_frames=n,
        output_type="np",
        **case.ref_steps,
        **case.params,
        **case.ref_params,
    )
    video = out.video if hasattr(out, "video") else out.frames[0]  # Cosmos3's output names it ``video``
    return (np.asarray(video) * 255).round().astype(np.uint8), getattr(out, "audio", None)


@pytest.mark.parametrize("tiny", list(CASES))
def test_frames_are_the_pipelines(tiny_model, tiny):
    case = CASES[tiny]
    folder = str(tiny_model(tiny))
    ref = reference_pipeline(case.pipeline, folder)
    h, w = case.size
    with Omni(model=folder) as omni:
        for n in case.counts:
            want, audio = _reference(ref, case, n)
            params = dict(seed=3, height=h, width=w, num_frames=n, num_inference_steps=1, **case.params)
            [out] = omni.generate({"prompt": PROMPT}, [params], use_tqdm=False)
            assert out.error is None, out.error
            got = np.asarray(out.video)
            assert got.shape == want.shape, (n, got.shape, want.shape)
            assert np.array_equal(got, want), n
            if audio is not None:  # LTX-2's soundtrack lasts the asked n / fps, not the frames made
                # (the tiny random vocoder's first samples are NaN at these lengths, in diffusers' output too)
                assert np.array_equal(out.audio, audio[0].float().numpy(), equal_nan=True), n
        for n in case.refused:
            with pytest.raises(ValueError):
                _reference(ref, case, n)
            with pytest.raises(InvalidRequestError) as err:
                omni.generate({"prompt": PROMPT}, [dict(height=h, width=w, num_frames=n)], use_tqdm=False)
            # (offline, a count under the parameters' own bound is named by where it was sent)
            assert err.value.field in ("num_frames", "sampling_params_list[0].num_frames"), err.value
