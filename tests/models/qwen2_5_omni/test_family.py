"""Family wiring and the speech stages without vLLM: folder resolution, voices, token2wav against transformers'
``Qwen2_5OmniToken2WavModel`` (same codes, same seed), its parameter checks."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.pipeline import resolve_pipeline
from omnistage.stages.generation.engine import GenerationItem


def test_speaking_folder_resolves_to_qwen2_5_omni_with_its_voices(omni25_dir):
    pipeline = resolve_pipeline(omni25_dir)
    assert pipeline.name == "qwen2_5_omni"  # not "chat", although vLLM knows the architecture
    assert [s.name for s in pipeline.stages] == ["thinker", "talker", "token2wav"]
    assert pipeline.for_model(omni25_dir).info.speech.voices == ("Chelsie", "Ethan")


def test_a_folder_without_speakers_resolves_to_the_thinker_alone(omni25_dir, tmp_path):
    folder = tmp_path / "no-speakers"
    shutil.copytree(omni25_dir, folder)
    (folder / "spk_dict.pt").unlink()
    pipeline = resolve_pipeline(folder)
    assert pipeline.name == "qwen2_5_omni_thinker" and len(pipeline.stages) == 1


@pytest.fixture(scope="module")
def token2wav(omni25_dir):
    from omnistage.models.qwen2_5_omni.token2wav import Token2WavAdapter

    return Token2WavAdapter(SimpleNamespace(model=str(omni25_dir), devices=None))


def item(codes, params, speaker="Chelsie"):
    return GenerationItem("r", {"codes": codes, "speaker": speaker}, params, {}, True)


def test_token2wav_equals_transformers_for_the_same_codes_and_seed(token2wav, reference):
    codes = torch.tensor([2894, 2491, 7848, 8131, 8326, 3317, 7015, 7508, 6648, 6731, 5167, 4614])
    speaker = reference.model.speaker_map["Ethan"]
    torch.manual_seed(3)
    with torch.no_grad():
        ref = reference.model.token2wav(
            codes[None], conditioning=speaker["cond"].float(), reference_mel=speaker["ref_mel"].float()
        ).reshape(-1)
    a, b = token2wav.run([item(codes, {"seed": 3}, "ethan"), item(codes, {"seed": 4}, "Ethan")])
    assert a["sample_rate"] == 24000 and a["audio"].shape == ref.shape and ref.abs().max() > 0.01
    assert torch.equal(a["audio"], ref)
    assert not torch.equal(b["audio"], ref)  # another seed, another draw


@pytest.mark.parametrize(
    "inputs, params, field",
    [
        (torch.tensor([1, 2]), {"num_steps": 1}, "num_steps"),
        (torch.tensor([1, 2]), {"guidance": 1.0}, "sampling_params_list[2]"),
        (torch.tensor([1, 2]), {"seed": -1}, "seed"),
        (torch.tensor([1, 99999]), {}, "codes"),
    ],
)
def test_token2wav_refuses_bad_input_naming_the_field(token2wav, inputs, params, field):
    (result,) = token2wav.run([item(inputs, params)])
    assert isinstance(result, InvalidRequestError) and result.field == field
    (speaker,) = token2wav.run([item(torch.tensor([1, 2]), {}, "Bob")])
    assert isinstance(speaker, InvalidRequestError) and speaker.field == "speaker"
