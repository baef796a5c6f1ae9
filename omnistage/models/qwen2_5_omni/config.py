"""What the family reads from a Qwen2.5-Omni folder: ``config.json``, ``generation_config.json`` (no torch), and the
speakers of ``spk_dict.pt`` (torch, on first use)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from omnistage.models.shared.omni.config import read_omni_config
from omnistage.models.shared.omni.sampling import sampling_defaults
from omnistage.pipeline import read_json

ARCHITECTURE = "Qwen2_5OmniForConditionalGeneration"
DEFAULT_SPEAKER = "Chelsie"  # transformers' Qwen2_5OmniForConditionalGeneration.generate(speaker="Chelsie")
SAMPLE_RATE = 24000  # token2wav's output rate in the release
SPEAKER_FILE = "spk_dict.pt"

# transformers' generate() defaults for the talker (talker_max_new_tokens, talker_do_sample, talker_top_k,
# talker_top_p, talker_temperature, talker_repetition_penalty), as vLLM SamplingParams keys
TALKER_DEFAULTS: dict[str, Any] = {
    "max_tokens": 4096,
    "temperature": 0.9,
    "top_k": 40,
    "top_p": 0.8,
    "repetition_penalty": 1.05,
}
# The sampling params token2wav reads (StageSpec.param_keys; the talker's: shared/omni/sampling.py): its
# Token2WavModel.forward arguments (defaults: its own) and ``seed``
TOKEN2WAV_DEFAULTS: dict[str, Any] = {"num_steps": 10, "guidance_scale": 0.5, "sway_coefficient": -1.0}
TOKEN2WAV_PARAM_KEYS = frozenset({"seed", *TOKEN2WAV_DEFAULTS})
# generate(talker_eos_token_id=[8292, 8294]): codec pad and codec end both end the speech
TALKER_EOS = (8292, 8294)


@dataclass(frozen=True)
class Omni25Config:
    folder: Path
    enable_audio_output: bool
    generation: dict[str, Any]
    dtype: str | None  # the checkpoint's (config.json ``dtype`` / ``torch_dtype``)

    @cached_property
    def speakers(self) -> dict[str, dict[str, Any]]:
        """``spk_dict.pt``: name -> {bos_token, cond, ref_mel}, as transformers' ``load_speakers`` reads it."""
        import torch

        path = self.folder / SPEAKER_FILE
        if not path.exists():
            raise ValueError(f"{self.folder}: no {SPEAKER_FILE} (the speakers' token2wav conditioning)")
        return dict(torch.load(path, weights_only=True))

    @property
    def voices(self) -> list[str]:
        return sorted(self.speakers)

    def speaker(self, name: str | None) -> str:
        """The checkpoint's spelling of speaker ``name`` (case-insensitive; None: the default)."""
        from omnistage.errors import InvalidRequestError

        name = DEFAULT_SPEAKER if name is None else name
        found = {k.lower(): k for k in self.speakers}
        if not isinstance(name, str) or name.lower() not in found:
            raise InvalidRequestError(
                "speaker", f"{name!r} is not one of this model's speakers ({', '.join(self.voices) or 'none'})"
            )
        return found[name.lower()]

    def sampling_defaults(self, stage: str) -> dict[str, Any]:
        """The checkpoint's generation config (``talker_*`` keys for the talker) over transformers' defaults."""
        return sampling_defaults(self.generation, stage, TALKER_DEFAULTS)


def load_omni25_config(folder: str | Path) -> Omni25Config:
    folder = Path(folder)
    raw = read_omni_config(folder, ARCHITECTURE)
    enable = (
        bool(raw.get("enable_audio_output", True))
        and bool(raw.get("talker_config"))
        and bool(raw.get("token2wav_config"))
        and (folder / SPEAKER_FILE).exists()
    )
    return Omni25Config(
        folder=folder,
        enable_audio_output=enable,
        generation=read_json(folder / "generation_config.json"),
        dtype=raw.get("dtype") or raw.get("torch_dtype"),
    )
