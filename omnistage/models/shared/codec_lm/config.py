"""``omnistage.json`` of a codec_tts folder: prompt format, voices and the codec-token layout.

Read without torch or vLLM (the server lists voices from it before any engine starts).
Every problem is a ``ValueError`` naming the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYOUTS = ("shared", "per_codebook")
CAUSAL_CODECS = {"mimi": True, "xcodec2": False}  # codec model_type -> is its decoder causal
NON_CAUSAL_CONTEXT = (32, 4)  # (frames before, frames after) each streamed block when the codec is not causal


@dataclass(frozen=True)
class TTSConfig:
    # Must contain "{text}"; may contain "{voice}" (replaced by the chosen voice's prefix) and "{ref_codes}"
    # (a cloned voice's reference codes, as codec tokens; the template without it cannot clone). With a
    # reference clip, "{text}" gets its transcript + ref_text_separator + the text (the Llasa recipe).
    prompt_template: str = "<|text_start|>{voice}{text}<|text_end|><|speech_start|>"
    voices: dict[str, str] = field(default_factory=dict)  # voice name -> text put at "{voice}"
    default_voice: str | None = None
    speech_end_token: str = "<|speech_end|>"  # the LM's stop token
    codec_token_offset: int = 0  # LM id of codec code 0
    codebook_size: int = 1024
    num_quantizers: int = 1  # K codec tokens per frame, frame-major
    # "shared": every codebook uses ids offset..offset+codebook_size-1 (Llasa-style);
    # "per_codebook": codebook q uses offset+q*codebook_size.. (Orpheus-style position offsets).
    layout: str = "shared"
    constrain_to_codec_tokens: bool = True  # LM may only sample codec tokens + the end token
    chunk_frames: int = 8  # async chunk: frames per streamed piece
    initial_chunk_frames: int | None = None  # the first piece (smaller: earlier first audio); None: chunk_frames
    # Frames decoded before / after each streamed block. None: for a causal codec its exact receptive
    # field / 0; for a non-causal one (XCodec2) the defaults of NON_CAUSAL_CONTEXT (approximate either way).
    decode_context_frames: int | None = None
    decode_lookahead_frames: int | None = None
    ref_text_separator: str = " "  # between a reference clip's transcript and the text to speak
    max_ref_audio_s: float = 30.0  # longest reference clip accepted for voice cloning

    @property
    def can_clone(self) -> bool:
        return "{ref_codes}" in self.prompt_template

    @property
    def num_codec_tokens(self) -> int:
        return self.codebook_size * (self.num_quantizers if self.layout == "per_codebook" else 1)

    def voice_prefix(self, voice: str | None) -> str:
        if voice is None:
            voice = self.default_voice
        if voice is None:
            return ""
        if voice not in self.voices:
            known = ", ".join(self.voices) or "none (this model has no voices)"
            raise ValueError(f"voice: {voice!r} is not one of {known}")
        return self.voices[voice]


def load_tts_config(folder: str | Path) -> TTSConfig:
    path = Path(folder) / "omnistage.json"
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (a codec_tts folder needs omnistage.json, lm/ and codec/)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    raw.pop("pipeline", None)
    known = set(TTSConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    cfg = TTSConfig(**raw)
    _check(cfg, path)
    return cfg


def _check(cfg: TTSConfig, path: Path) -> None:
    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"{path}: {key}: {why}")

    if not isinstance(cfg.prompt_template, str) or cfg.prompt_template.count("{text}") != 1:
        raise bad("prompt_template", "must contain '{text}' exactly once")
    if cfg.prompt_template.count("{ref_codes}") > 1:
        raise bad("prompt_template", "'{ref_codes}' may appear once")
    rest = cfg.prompt_template.replace("{text}", "").replace("{voice}", "").replace("{ref_codes}", "")
    if "{" in rest and "}" in rest.split("{", 1)[1]:
        raise bad("prompt_template", "only the placeholders {text}, {voice} and {ref_codes} are supported")
    if not isinstance(cfg.voices, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in cfg.voices.items()
    ):
        raise bad("voices", "expected an object mapping voice names to prompt text")
    if cfg.voices and "{voice}" not in cfg.prompt_template:
        raise bad("voices", "the prompt_template has no '{voice}' placeholder to put them in")
    if cfg.default_voice is not None and cfg.default_voice not in cfg.voices:
        raise bad("default_voice", f"{cfg.default_voice!r} is not one of the voices")
    for key in ("codec_token_offset", "codebook_size", "num_quantizers", "chunk_frames"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "codec_token_offset" else 1):
            raise bad(
                key,
                f"expected a {'non-negative' if key == 'codec_token_offset' else 'positive'} integer, got {value!r}",
            )
    for key in ("initial_chunk_frames", "decode_context_frames", "decode_lookahead_frames"):
        value = getattr(cfg, key)
        low = 1 if key == "initial_chunk_frames" else 0
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise bad(key, f"expected a{' positive' if low else ' non-negative'} integer or null, got {value!r}")
    if not isinstance(cfg.ref_text_separator, str):
        raise bad("ref_text_separator", f"expected a string, got {cfg.ref_text_separator!r}")
    m = cfg.max_ref_audio_s
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
        raise bad("max_ref_audio_s", f"expected a positive number of seconds, got {m!r}")
    if cfg.layout not in LAYOUTS:
        raise bad("layout", f"{cfg.layout!r} is not one of {', '.join(LAYOUTS)}")


def lookahead_frames(cfg: TTSConfig, codec_model_type: str) -> int:
    """Frames the codec stage decodes after each streamed block (0 for a causal codec by default)."""
    if cfg.decode_lookahead_frames is not None:
        return cfg.decode_lookahead_frames
    return 0 if CAUSAL_CODECS.get(codec_model_type, True) else NON_CAUSAL_CONTEXT[1]
