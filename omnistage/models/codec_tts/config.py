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


@dataclass(frozen=True)
class TTSConfig:
    # Must contain "{text}"; may contain "{voice}" (replaced by the chosen voice's prefix).
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
    decode_context_frames: int | None = None  # None: the codec's exact receptive field

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
    rest = cfg.prompt_template.replace("{text}", "").replace("{voice}", "")
    if "{" in rest and "}" in rest.split("{", 1)[1]:
        raise bad("prompt_template", "only the placeholders {text} and {voice} are supported")
    if not isinstance(cfg.voices, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in cfg.voices.items()):
        raise bad("voices", "expected an object mapping voice names to prompt text")
    if cfg.voices and "{voice}" not in cfg.prompt_template:
        raise bad("voices", "the prompt_template has no '{voice}' placeholder to put them in")
    if cfg.default_voice is not None and cfg.default_voice not in cfg.voices:
        raise bad("default_voice", f"{cfg.default_voice!r} is not one of the voices")
    for key in ("codec_token_offset", "codebook_size", "num_quantizers", "chunk_frames"):
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "codec_token_offset" else 1):
            raise bad(key, f"expected a {'non-negative' if key == 'codec_token_offset' else 'positive'} integer, got {value!r}")
    ctx = cfg.decode_context_frames
    if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 0):
        raise bad("decode_context_frames", f"expected a non-negative integer or null, got {ctx!r}")
    if cfg.layout not in LAYOUTS:
        raise bad("layout", f"{cfg.layout!r} is not one of {', '.join(LAYOUTS)}")


def folder_info(folder: Path) -> dict[str, Any]:
    """What the HTTP server shows before engines start: voices and the output sample rate."""
    cfg = load_tts_config(folder)
    info: dict[str, Any] = {"voices": list(cfg.voices), "default_voice": cfg.default_voice}
    codec_config = folder / "codec" / "config.json"
    if codec_config.is_file():
        rate = json.loads(codec_config.read_text()).get("sampling_rate")
        if rate:
            info["sample_rate"] = int(rate)
    return info
