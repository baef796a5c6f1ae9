"""What an llm stage takes, and how vLLM's own renderer turns it into an engine input.

A stage input (a source stage's prompt or an edge processor's output) is one of

- ``{"prompt_token_ids": [...], "prompt"?: str}``: token ids as they are;
- ``{"prompt": str, "multi_modal_data"?: {...}, "mm_processor_kwargs"?: {...}}``:
  as ``vllm.LLM.generate`` takes it (the text carries the model's placeholders);
- ``{"messages": [...], "mm_processor_kwargs"?: {...}, "chat_template_kwargs"?: {...}}``: as ``LLM.chat``
  and the OpenAI server take it. ``chat_template_kwargs`` may hold
  ``add_generation_prompt`` and ``continue_final_message``. Message content
  parts are vLLM's: ``text``, ``image_url`` / ``audio_url`` / ``video_url``
  (``data:``, ``http(s)://``, ``file://`` under vLLM's ``allowed_local_media_path``),
  ``input_audio``, ``image_pil`` (a PIL image), and the ``*_embeds`` parts;
- ``{"encoder_prompt": {"prompt": str, "multi_modal_data": {...}}, "decoder_prompt": str}``: an
  encoder-decoder model's explicit prompt (Whisper), as ``LLM.generate`` takes it.

``multi_modal_data`` holds ``image``: PIL | [PIL], ``audio``: (array, rate) | [...],
``video``: frames | [frames]. With ``messages`` the media live in the message
parts (``multi_modal_data`` next to messages is refused, not ignored).

Templating, media loading and the model's processor are vLLM's
(``renderer.render_chat_async`` / ``render_cmpl_async``), so a stage's prompt is
token for token what vLLM itself would build. This module only checks shapes,
counts media against the model's limits (naming the offending part) and maps
vLLM's complaints to ``InvalidRequestError``; model_media.py puts the media in the model's form first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.stages.llm.model_media import in_model_form, is_audio_item, messages_in_model_form

# Keys an llm stage understands; anything else in an edge's output is a wiring bug.
INPUT_KEYS = {
    "prompt",
    "prompt_token_ids",
    "messages",
    "multi_modal_data",
    "mm_processor_kwargs",
    "negative_prompt",
    "chat_template_kwargs",
    "modalities",
    "conversation",  # a later stage's conversation (speech_chat's edge reads it; this stage does not)
    "encoder_prompt",
    "decoder_prompt",
}
MODALITIES = ("image", "audio", "video")

# vLLM's chat content part types (renderers/chat_utils.py MM_PARSER_MAP) by what they carry.
TEXT_PARTS = {"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"}
MEDIA_PARTS = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
}


@dataclass
class StagePrompt:
    """One validated llm-stage input, before vLLM renders it."""

    field: str  # the request field that problems with the prompt as a whole are reported against
    token_ids: list[int] | None = None
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    multi_modal_data: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    media: list[tuple[str, str]] = field(default_factory=list)  # (field, modality) of each item, in order
    # Encoder-decoder models: ``text`` is the decoder prompt, ``multi_modal_data`` the encoder's media.
    encoder_text: str | None = None

    @property
    def needs_renderer(self) -> bool:
        return self.token_ids is None or self.multi_modal_data is not None or self.encoder_text is not None


# --------------------------------------------------------------------------- parsing (no vLLM)


def parse(inputs: Mapping[str, Any]) -> StagePrompt:
    """Shape checks; every problem is an ``InvalidRequestError`` naming the field."""
    unknown = sorted(set(inputs) - INPUT_KEYS)
    if unknown:
        raise InvalidRequestError("prompt", f"unsupported key(s) for an llm stage: {', '.join(unknown)}")
    mm_kwargs = inputs.get("mm_processor_kwargs")
    if mm_kwargs is not None and not isinstance(mm_kwargs, Mapping):
        raise InvalidRequestError("mm_processor_kwargs", f"expected an object, got {type(mm_kwargs).__name__}")
    mm_kwargs = dict(mm_kwargs) if mm_kwargs else None
    if inputs.get("encoder_prompt") is not None:
        return _parse_enc_dec(inputs, mm_kwargs)
    if inputs.get("decoder_prompt") is not None:
        raise InvalidRequestError("encoder_prompt", "a decoder_prompt needs its encoder_prompt")
    if inputs.get("prompt_token_ids") is not None:
        ids = inputs["prompt_token_ids"]
        if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise InvalidRequestError("prompt_token_ids", "expected a list of integers")
        mm, media = _multi_modal_data(inputs.get("multi_modal_data"))
        return StagePrompt(
            "prompt",
            token_ids=list(ids),
            text=inputs.get("prompt"),
            multi_modal_data=mm,
            mm_processor_kwargs=mm_kwargs,
            media=media,
        )
    if inputs.get("messages") is not None:
        if inputs.get("multi_modal_data"):
            raise InvalidRequestError(
                "multi_modal_data",
                "with 'messages' the media go in the messages' content "
                "parts (image_url, image_pil, audio_url, input_audio, video_url)",
            )
        messages = inputs["messages"]
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages", "expected a non-empty list")
        media = [m for i, msg in enumerate(messages) for m in _message_media(i, msg)]
        return StagePrompt(
            "messages",
            messages=messages,
            mm_processor_kwargs=mm_kwargs,
            media=media,
            chat_template_kwargs=_chat_template_kwargs(inputs.get("chat_template_kwargs")),
        )
    prompt = inputs.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequestError("prompt", "needs 'prompt' (string), 'prompt_token_ids' or 'messages'")
    mm, media = _multi_modal_data(inputs.get("multi_modal_data"))
    return StagePrompt("prompt", text=prompt, multi_modal_data=mm, mm_processor_kwargs=mm_kwargs, media=media)


def _parse_enc_dec(inputs: Mapping[str, Any], mm_kwargs: dict[str, Any] | None) -> StagePrompt:
    enc, dec = inputs["encoder_prompt"], inputs.get("decoder_prompt")
    if not isinstance(enc, Mapping) or not isinstance(enc.get("prompt", ""), str):
        raise InvalidRequestError("encoder_prompt", "expected an object with 'prompt' (string) and 'multi_modal_data'")
    if not isinstance(dec, str):
        raise InvalidRequestError("decoder_prompt", "expected a string")
    stray = sorted(set(inputs) & {"prompt", "prompt_token_ids", "messages", "multi_modal_data"})
    if stray:
        raise InvalidRequestError(stray[0], "not allowed next to 'encoder_prompt' (media go in the encoder prompt)")
    mm, media = _multi_modal_data(enc.get("multi_modal_data"))
    media = [(f"encoder_prompt.{where}", modality) for where, modality in media]
    return StagePrompt(
        "decoder_prompt",
        text=dec,
        multi_modal_data=mm,
        mm_processor_kwargs=mm_kwargs,
        media=media,
        encoder_text=enc.get("prompt", ""),
    )


def decoder_token_ids(engine_input: Mapping[str, Any]) -> list[int]:
    """The prompt ids the engine generates after: the decoder's for an encoder-decoder input."""
    if engine_input.get("type") == "enc_dec":
        return list(engine_input["decoder_prompt"]["prompt_token_ids"])
    return list(engine_input["prompt_token_ids"])


def prompt_media_tokens(engine_input: Mapping[str, Any]) -> dict[str, int]:
    """Prompt tokens per media modality (``audio``, ``image``, ``video``): the lengths of vLLM's placeholder ranges
    in the prompt the engine generates after (an encoder-decoder's media live in its encoder: none here)."""
    placeholders = engine_input.get("mm_placeholders") if engine_input.get("type") != "enc_dec" else None
    return {m: sum(int(r.length) for r in ranges) for m, ranges in (placeholders or {}).items()}


def _chat_template_kwargs(opts: Any) -> dict[str, Any]:
    opts = opts or {}
    if not isinstance(opts, Mapping):
        raise InvalidRequestError("chat_template_kwargs", f"expected an object, got {type(opts).__name__}")
    opts = dict(opts)
    for flag in ("add_generation_prompt", "continue_final_message"):
        if flag in opts and not isinstance(opts[flag], bool):
            raise InvalidRequestError(flag, f"expected true or false, got {opts[flag]!r}")
    if opts.get("continue_final_message") and opts.get("add_generation_prompt"):
        raise InvalidRequestError(
            "continue_final_message", "cannot be combined with add_generation_prompt (set it to false)"
        )
    if opts.get("continue_final_message"):
        opts.setdefault("add_generation_prompt", False)
    return opts


def _message_media(i: int, msg: Any) -> list[tuple[str, str]]:
    if not isinstance(msg, Mapping) or "role" not in msg:
        raise InvalidRequestError(f"messages[{i}]", "expected an object with 'role' and 'content'")
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return []
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"messages[{i}].content", f"expected a string or a list of parts, got {type(content).__name__}"
        )
    media = []
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(part, str):
            continue
        if not isinstance(part, Mapping):
            raise InvalidRequestError(where, f"expected an object, got {type(part).__name__}")
        kind = part.get("type") or next((k for k in MEDIA_PARTS if k in part), None)
        if kind in MEDIA_PARTS:
            media.append((f"{where}.{kind}", MEDIA_PARTS[kind]))
        elif kind not in TEXT_PARTS:
            raise InvalidRequestError(
                f"{where}.type",
                f"unsupported content part type {kind!r}; "
                f"expected one of {', '.join(sorted(TEXT_PARTS | set(MEDIA_PARTS)))}",
            )
    return media


def _multi_modal_data(mm: Any) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
    """Checked and normalised ``multi_modal_data`` (audio items as ``(array, rate)`` tuples:
    a transport may have turned them into lists), and its items for counting."""
    if mm is None:
        return None, []
    if not isinstance(mm, Mapping):
        raise InvalidRequestError("multi_modal_data", f"expected an object, got {type(mm).__name__}")
    out: dict[str, Any] = {}
    media: list[tuple[str, str]] = []
    for key, value in mm.items():
        if key not in MODALITIES:
            # other keys (e.g. a family's precomputed inputs) pass through to vLLM's own checks
            out[key] = value
            continue
        items = _items(key, value)
        if items:
            out[key] = items  # vLLM takes a list for every modality
            media += [(f"multi_modal_data.{key}[{k}]", key) for k in range(len(items))]
    return (out or None), media


def _items(modality: str, value: Any) -> list[Any]:
    if modality == "audio":
        if is_audio_item(value):
            return [tuple(value)]
        if isinstance(value, (list, tuple)):
            return [tuple(v) if is_audio_item(v) else v for v in value]
        return [value]  # a bare waveform: the processor's own sampling rate is assumed, as in vLLM
    if modality == "video" and isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], Mapping):
        return [tuple(value)]  # one video as (frames, metadata)
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


# --------------------------------------------------------------------------- media limits (vLLM's own)


def check_media(prompt: StagePrompt, engine: Any) -> None:
    """A text-only model, a modality the model lacks, or more items than ``limit_mm_per_prompt``
    allows: a 400 naming the first offending part (vLLM itself would name only the modality)."""
    if not prompt.media:
        return
    from vllm.exceptions import VLLMValidationError

    if not engine.model_config.is_multimodal_model:
        where, modality = prompt.media[0]
        raise InvalidRequestError(where, f"this model takes text only; it cannot take {modality} input")
    info = engine.renderer.get_mm_processor().info  # vLLM's processing info for this model
    supported = sorted(info.supported_mm_limits)
    counts: dict[str, int] = {}
    for where, modality in prompt.media:
        if modality not in info.supported_mm_limits:
            raise InvalidRequestError(where, f"this model takes no {modality} input (it takes {', '.join(supported)})")
        counts[modality] = counts.get(modality, 0) + 1
        try:
            info.validate_num_items(modality, counts[modality])
        except VLLMValidationError as e:
            raise InvalidRequestError(where, f"{e.args[0]} (limit_mm_per_prompt)") from None


# --------------------------------------------------------------------------- rendering (vLLM's renderer)


async def render(engine: Any, prompt: StagePrompt) -> Any:
    """The engine input vLLM's own entry points would build (``LLM.generate`` / ``LLM.chat``)."""
    from jinja2 import TemplateError
    from vllm.exceptions import VLLMValidationError
    from vllm.inputs import TextPrompt, TokensPrompt
    from vllm.inputs.engine import tokens_input

    if not prompt.needs_renderer:
        return tokens_input(prompt.token_ids, prompt=prompt.text)
    renderer = engine.renderer
    extras = {"mm_processor_kwargs": prompt.mm_processor_kwargs} if prompt.mm_processor_kwargs else None
    try:
        if prompt.messages is not None:
            from vllm.renderers.params import ChatParams
            from vllm.utils.mistral import is_mistral_tokenizer

            # The chat params LLM.chat and the OpenAI server build: text out of the template, unless
            # the tokenizer (Mistral) or prompt embeddings need ids straight from it.
            tokenize = is_mistral_tokenizer(renderer.tokenizer) or engine.model_config.enable_prompt_embeds
            chat = ChatParams(
                chat_template_kwargs={
                    "add_generation_prompt": True,
                    **prompt.chat_template_kwargs,
                    "tokenize": tokenize,
                },
                mm_processor_kwargs=prompt.mm_processor_kwargs,
            )
            # As LLM.chat and the OpenAI server: the template places the special tokens.
            tok = _unbounded(renderer.default_chat_tok_params).with_kwargs(add_special_tokens=False)
            messages = await messages_in_model_form(engine, prompt.messages)
            _, (engine_input,) = await renderer.render_chat_async([messages], chat, tok, prompt_extras=extras)
            return engine_input
        mm = in_model_form(engine, prompt.multi_modal_data)
        if prompt.encoder_text is not None:
            enc = TextPrompt(prompt=prompt.encoder_text)
            if mm is not None:
                enc["multi_modal_data"] = mm
            enc_dec: Any = {"encoder_prompt": enc, "decoder_prompt": TextPrompt(prompt=prompt.text or "")}
            return (
                await renderer.render_cmpl_async(
                    [enc_dec], _unbounded(renderer.default_cmpl_tok_params), prompt_extras=extras
                )
            )[0]
        if prompt.token_ids is not None:
            dict_prompt: Any = TokensPrompt(prompt_token_ids=prompt.token_ids)
            if prompt.text is not None:
                dict_prompt["prompt"] = prompt.text
        else:
            dict_prompt = TextPrompt(prompt=prompt.text)
        if mm is not None:
            dict_prompt["multi_modal_data"] = mm
        tok = _unbounded(renderer.default_cmpl_tok_params)
        return (await renderer.render_cmpl_async([dict_prompt], tok, prompt_extras=extras))[0]
    except VLLMValidationError as e:
        raise InvalidRequestError(_field(prompt, e.parameter), e.args[0]) from None
    except (ValueError, TypeError, OSError, TemplateError) as e:
        # vLLM's chat parsing, media loading (OSError: an undecodable image) and the model's processor
        # reject the caller's input this way
        raise InvalidRequestError(prompt.field, f"{type(e).__name__}: {e}") from None


def _unbounded(params: Any) -> Any:
    """The renderer's tokenize params without its own length check: the stage checks the
    rendered length itself (naming max_tokens too), after multimodal expansion."""
    return dataclasses.replace(params, max_total_tokens=None)


def _field(prompt: StagePrompt, parameter: str | None) -> str:
    if parameter in MODALITIES and prompt.multi_modal_data is not None:
        return f"{'encoder_prompt.' if prompt.encoder_text is not None else ''}multi_modal_data.{parameter}"
    if parameter in ("mm_processor_kwargs", "chat_template_kwargs"):
        return parameter
    return prompt.field
