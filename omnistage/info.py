"""What a pipeline tells the server and the CLI about the model it serves (``Pipeline.info``).

Declared with the pipeline and completed from the model folder (``Pipeline.folder_info``, e.g. the voices a
checkpoint defines). Frozen typed classes: a misspelt field is a ``TypeError`` when the family is declared, not
a silent default on a request. Three parts:

- ``PipelineInfo``: what every pipeline says (whether it is a chat model, its served name, a small model's
  vocabulary and example prompts), with the two below when it has them;
- ``SpeechInfo``: what a pipeline that speaks says (output rate, voices, cloning, speed), with ``CodeFrames``
  where its LM makes audio frame by frame;
- ``RecognizerInfo``: what a pipeline that recognises speech says (how the transcription routes feed it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


def _tuples(obj: Any, *names: str) -> None:
    """A family may give lists; the frozen info keeps tuples (nothing downstream can append to them)."""
    for name in names:
        value = getattr(obj, name)
        if value is not None and not isinstance(value, tuple):
            object.__setattr__(obj, name, tuple(value))


@dataclass(frozen=True)
class CodeFrames:
    """How a speech pipeline's LM steps become frames of audio: what a caller sets to get exactly N frames (the
    streaming and load benchmarks), and what decodes them."""

    codec: str  # the decoder's name (reports name it)
    samples_per_frame: int | None = None  # audio samples one frame decodes to, at the speech sample rate
    tokens_per_frame: int = 1  # LM tokens per frame (K for an LM that writes a frame's K codebooks one by one)
    lead_tokens: int = 0  # LM tokens that make no frame (a talker's closing token, a delay pattern's ramp)
    takes_min_tokens: bool = True  # its LM honours min_tokens; without it an early stop may shorten a request
    # the LM params that make its output the same on every run
    repeatable: Mapping[str, Any] = field(default_factory=lambda: {"temperature": 0.0})
    initial_chunk_frames: int | None = None  # frames of the first streamed piece (None: the chunk size)

    def lm_tokens(self, frames: int) -> int:
        """The LM tokens that make ``frames`` frames."""
        return frames * self.tokens_per_frame + self.lead_tokens


@dataclass(frozen=True)
class SpeechInfo:
    """A pipeline that speaks (/v1/audio/speech, chat audio, realtime)."""

    sample_rate: int | None = None  # Hz of its audio (the X-Sample-Rate header, the realtime output rate)
    voices: tuple[str, ...] = ()  # preset voices (/v1/audio/voices, the model card)
    default_voice: str | None = None
    voices_case_insensitive: bool = False  # a request's voice names a preset whatever its case
    supports_voice_cloning: bool = False  # ref_audio + ref_text, or a registered voice
    max_ref_audio_s: float | None = None  # the longest reference clip it takes (None: the server's default)
    supports_speed: bool = False  # a speed other than 1.0
    languages: tuple[str, ...] = ()  # the languages it speaks, where it names them
    needs_voice: bool = False  # every request names a voice or clones one (it has no speaker of its own)
    clones_from_embedding: bool = False  # it also clones from a clip's speaker embedding alone (x_vector_only_mode)
    splits_text: bool = False  # it speaks a text sentence by sentence on request (enable_text_splitting)
    frames: CodeFrames | None = None  # how its LM's steps become audio frames, where it makes them one by one

    def __post_init__(self) -> None:
        _tuples(self, "voices", "languages")
        if self.default_voice is not None and self.voices and self.default_voice not in self.voices:
            raise ValueError(f"default_voice {self.default_voice!r} is not one of the voices {list(self.voices)}")


@dataclass(frozen=True)
class RecognizerInfo:
    """A pipeline that recognises speech: how /v1/audio/transcriptions and translations feed it."""

    sample_rate: int = 16000  # the rate uploads are resampled to
    window_s: float = 30  # longer audio is cut into windows of this length
    languages: tuple[str, ...] = ()  # ISO 639-1 codes it knows
    tasks: tuple[str, ...] = ("transcribe",)  # and "translate" where it translates to English
    default_language: str | None = None  # a request without a language, where none is detected
    language_token_ids: Mapping[str, int] = field(default_factory=dict)  # code -> token: it detects the language
    # the model names the language before its text (omnistage.server.transcripts.LanguagePrefix's fields)
    language_prefix: Mapping[str, Any] | None = None
    unforced_language: bool = False  # a request without a language gets a prompt naming none (the model hears it)
    # its own timestamp tokens: {"timestamp_begin", "seconds_per_timestamp", "tokenizer"} (omnistage.server.segments)
    timestamps: Mapping[str, Any] | None = None
    max_audio_s: float | None = None  # the longest upload (None: the server's default)

    def __post_init__(self) -> None:
        _tuples(self, "languages", "tasks")


@dataclass(frozen=True)
class PipelineInfo:
    """What every pipeline says; ``speech`` / ``transcription`` where it speaks / recognises speech."""

    chat: bool = True  # a chat model: it takes messages (/v1/chat/completions, a realtime conversation)
    default_model: str | None = None  # the folder served when none is given (the demo's shipped weights)
    served_model_name: str | None = None  # the name the server lists, when not the folder's
    # a model that draws only what its training captions named: kind -> words, and the other words it knows
    vocabulary: Mapping[str, tuple[str, ...]] | None = None
    filler_words: tuple[str, ...] = ()
    example_prompts: tuple[str, ...] = ()  # prompts that work (the playground offers them)
    # "WxH" sizes a model draws at; empty: any. Another size still runs, with a warning (a model trained at one
    # size, as the demo is, draws shapeless colour at others)
    trained_sizes: tuple[str, ...] = ()
    # {"native": [w, h], "max_side": n, "multiple": m}: sizes the model card offers (omnistage.server.image_sizes)
    image_size: Mapping[str, Any] | None = None
    image_batch: bool = False  # an edit of several input images edits each on its own (n is per image)
    image_edits: bool = True  # an image model takes input images (/v1/images/edits); False: it draws from text only
    # it takes an input video (video-to-video, actions from frames): /v1/videos' video_reference
    video_input: bool = False
    video_mask: bool = False  # it takes a mask video beside the input video (Wan VACE): /v1/videos' mask
    speech: SpeechInfo | None = None
    transcription: RecognizerInfo | None = None
    # full duplex: sessions stream audio in and frames out, stepped frame by frame (AsyncOmni.open_duplex)
    duplex: bool = False

    def __post_init__(self) -> None:
        _tuples(self, "filler_words", "example_prompts", "trained_sizes")
        for name, typ in (("speech", SpeechInfo), ("transcription", RecognizerInfo)):
            value = getattr(self, name)
            if value is not None and not isinstance(value, typ):
                raise TypeError(f"PipelineInfo.{name} must be a {typ.__name__}, got {type(value).__name__}")

    @property
    def speaks(self) -> SpeechInfo:
        """The speech info, or the defaults of one (for routes that serve any pipeline producing audio)."""
        return self.speech or SpeechInfo()

    def with_speech(self, **changes: Any) -> PipelineInfo:
        """This info with ``changes`` to its speech part (a folder's voices, say)."""
        return replace(self, speech=replace(self.speaks, **changes))

    def with_transcription(self, **changes: Any) -> PipelineInfo:
        """This info with ``changes`` to its recogniser part (a checkpoint's language tokens, say)."""
        return replace(self, transcription=replace(self.transcription or RecognizerInfo(), **changes))
