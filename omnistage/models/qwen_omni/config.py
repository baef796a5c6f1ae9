"""What the family reads from a Qwen3-Omni folder's ``config.json`` and ``generation_config.json``
without importing torch or transformers (the server lists voices before any engine starts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.models.shared.omni.config import read_omni_config
from omnistage.models.shared.omni.sampling import sampling_defaults
from omnistage.pipeline import read_json

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
DEFAULT_SPEAKER = "Ethan"  # transformers' Qwen3OmniMoeForConditionalGeneration.generate(speaker="Ethan")
SAMPLE_RATE = 24000  # code2wav's output rate in the release (1920 samples per 12.5 Hz codec frame)

# transformers' generate() defaults for the talker (talker_max_new_tokens, talker_do_sample, talker_top_k,
# talker_top_p, talker_temperature, talker_repetition_penalty), as vLLM SamplingParams keys.
TALKER_DEFAULTS: dict[str, Any] = {
    "max_tokens": 4096,
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
}
# The sampling params code2wav reads (StageSpec.param_keys; the talker's: shared/omni/sampling.py): its async-chunk
# piece sizes and ``seed`` (routed to final stages as a generic knob, unused)
CODE2WAV_PARAM_KEYS = frozenset({"chunk_frames", "initial_codec_chunk_frames", "seed"})


@dataclass(frozen=True)
class OmniConfig:
    speakers: dict[str, int]  # lower-case name -> talker codec id (config.talker_config.speaker_id)
    enable_audio_output: bool
    generation: dict[str, Any]  # generation_config.json
    dtype: str | None = None  # the checkpoint's (config.json ``dtype`` / ``torch_dtype``)
    media_token_ids: frozenset[int] = frozenset()  # the thinker's audio / image / video placeholders
    accept_hidden_layer: int = 0  # the thinker layer whose output the talker reads at media positions

    @property
    def voices(self) -> list[str]:
        """Speaker names as the model card writes them (``Ethan``); matching is case-insensitive, as in
        transformers (``speaker.lower()``)."""
        return [name.capitalize() for name in self.speakers]

    def speaker_id(self, name: str | None) -> int:
        from omnistage.errors import InvalidRequestError

        name = DEFAULT_SPEAKER if name is None else name
        if not isinstance(name, str) or name.lower() not in self.speakers:
            raise InvalidRequestError(
                "speaker", f"{name!r} is not one of this model's speakers ({', '.join(self.voices) or 'none'})"
            )
        return self.speakers[name.lower()]

    def sampling_defaults(self, stage: str) -> dict[str, Any]:
        return sampling_defaults(self.generation, stage, TALKER_DEFAULTS)


def load_omni_config(folder: str | Path) -> OmniConfig:
    folder = Path(folder)
    raw = read_omni_config(folder, ARCHITECTURE)
    talker = raw.get("talker_config") or {}
    speakers = {str(k).lower(): int(v) for k, v in (talker.get("speaker_id") or {}).items()}
    enable = bool(raw.get("enable_audio_output", True)) and bool(talker)
    thinker = raw.get("thinker_config") or {}
    media = frozenset(int(thinker[k]) for k in ("audio_token_id", "image_token_id", "video_token_id") if k in thinker)
    return OmniConfig(
        speakers=speakers,
        enable_audio_output=enable,
        generation=read_json(folder / "generation_config.json"),
        dtype=raw.get("dtype") or raw.get("torch_dtype"),
        media_token_ids=media,
        accept_hidden_layer=int(talker.get("accept_hidden_layer", 0)),
    )
