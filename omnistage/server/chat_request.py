"""The request a chat completion body becomes (``/v1/chat/completions`` and ``/v1/realtime``): the output
modalities, the prompt (messages for autoregressive source stages, else the last user text and decoded media),
the voice or speech fields, every check before model work."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from omnistage.engine.request import OmniRequest
from omnistage.media_intake import model_audio_rate
from omnistage.modality import OutputModality
from omnistage.params import validation_error
from omnistage.server.errors import bad_request
from omnistage.server.media import (
    audio_from_bytes,
    decode_base64,
    fetch_media,
    load_audio,
    load_image,
    load_video,
    model_form_part,
)
from omnistage.server.protocol import ChatCompletionRequest, SpeechRequest
from omnistage.server.speech_request import speech_input
from omnistage.server.state import ServerState
from omnistage.speech import SpeechInput


async def build_chat_request(
    state: ServerState, body: ChatCompletionRequest, rid: str, transcript: bool = False
) -> OmniRequest:
    """A chat body as the engine's request, every check before model work (also /v1/realtime's path).
    ``transcript``: speech asked without text still runs for the text too (the answer's ``audio.transcript``)."""
    lora = state.check_model(body.model)
    if body.logprobs:
        raise bad_request("logprobs: not supported", "logprobs")
    engine = state.engine
    modalities = _modalities(state, body.modalities)
    knobs = body.knobs(body.extra_body)
    state.check_n(knobs.n)
    wants = OutputModality(0)
    for m in modalities or engine.output_modalities.names():
        wants |= OutputModality.parse(m)
    if (knobs.n or 1) > 1 and OutputModality.TEXT in wants and state.text_stages():
        raise bad_request("n: only n=1 is supported for text output", "n")
    prompt = await build_prompt(state, body)
    if OutputModality.TEXT in engine.output_modalities:
        _choose_voice(state, body, knobs, prompt)
    else:  # a speech family (Qwen3-TTS, VibeVoice, ...): the speech route's voice / clone / language fields
        await _speech_fields(state, body, knobs, prompt)
    if transcript and text_hidden(state, body):
        modalities = [*(modalities or []), "text"]
    req = state.make_request(prompt, rid, body.sampling_params_list, modalities, knobs, lora)
    req.session_id = body.prompt_cache_key
    return req


def text_hidden(state: ServerState, body: ChatCompletionRequest) -> bool:
    """Speech asked without text of a model that speaks its text reply: the text is the speech's transcript
    (OpenAI's ``audio.transcript``), not the message content."""
    if not body.modalities or OutputModality.TEXT not in state.engine.output_modalities:
        return False
    asked = OutputModality(0)
    for m in body.modalities:
        asked |= OutputModality.parse(m)
    return OutputModality.AUDIO in asked and OutputModality.TEXT not in asked


def _choose_voice(state: ServerState, body: ChatCompletionRequest, knobs: Any, prompt: dict[str, Any]) -> None:
    """OpenAI's ``audio.voice`` (or ``speaker`` in extra_body) picks one of the model's voices."""
    chosen = body.audio is not None and body.audio.voice is not None
    voice = body.audio.voice if chosen else knobs.extras().get("speaker")
    if voice is None:
        return
    field = "audio.voice" if chosen else "speaker"
    names = list(state.engine.pipeline.info.speaks.voices)
    if not isinstance(voice, str) or voice.lower() not in {n.lower() for n in names}:
        raise bad_request(f"{field}: {voice!r} is not one of this model's voices ({', '.join(names) or 'none'})", field)
    prompt["speech"] = SpeechInput(voice=voice)


# the speech route's fields a chat turn to a speech family may carry in extra_body
SPEECH_CHAT_FIELDS = (
    "instructions",
    "language",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "enable_text_splitting",
    "initial_codec_chunk_frames",
)


async def _speech_fields(state: ServerState, body: ChatCompletionRequest, knobs: Any, prompt: dict[str, Any]) -> None:
    """``audio.voice`` plus the speech route's own fields given in ``extra_body`` (``language``,
    ``instructions``, ``ref_audio`` + ``ref_text``, ...), checked and resolved as ``/v1/audio/speech`` does
    them: a preset or registered voice, a clone's clip fetched and decoded through the decode limits."""
    extras = knobs.extras()
    fields = {k: extras[k] for k in SPEECH_CHAT_FIELDS if k in extras}
    voice = body.audio.voice if body.audio is not None and body.audio.voice is not None else extras.get("speaker")
    try:
        speech = SpeechRequest.model_validate({"input": ".", "voice": voice, **fields})
    except ValidationError as e:
        raise validation_error(e, "extra_body.") from None
    typed = await speech_input(state, speech)
    if typed is not None:
        prompt["speech"] = typed


def _modalities(state: ServerState, asked: list[str] | None) -> list[str] | None:
    if asked is None:
        return None
    produced = state.engine.output_modalities
    for i, name in enumerate(asked):
        try:
            m = OutputModality.parse(name)
        except ValueError as e:
            raise bad_request(f"modalities[{i}]: {e}", "modalities") from None
        if m & ~produced:
            raise bad_request(
                f"modalities: model {state.model_name!r} does not produce {name} (it produces {produced})", "modalities"
            )
    if not asked:
        raise bad_request("modalities: empty list", "modalities")
    return asked


# --------------------------------------------------------------------------- prompt


async def build_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    """Messages for autoregressive source stages (vLLM's renderer templates them and loads their media);
    the last user text and decoded media otherwise."""
    sources = [s for s in state.engine.pipeline.stages if not s.inputs]
    if any(s.kind in ("llm", "ar") for s in sources):  # an AR speech family's hook reads the messages
        return await _chat_prompt(state, body)
    return await _decoded_prompt(state, body)


async def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    """OpenAI messages as vLLM's chat renderer takes them. Media parts are fetched here (the
    server's limits and allowlist), checked to decode, and passed on as base64 ``data:`` URLs."""
    messages: list[dict[str, Any]] = []
    pending: list[Any] = []  # media fetches, run together
    for i, msg in enumerate(body.messages):
        entry = msg.model_dump(exclude_none=True)
        if isinstance(msg.content, list):
            parts: list[dict[str, Any]] = []
            for j, part in enumerate(msg.content):
                where = f"messages[{i}].content[{j}]"
                if part.type in ("text", "input_text"):
                    parts.append({"type": "text", "text": part.text})
                    continue
                out: dict[str, Any] = {"type": part.type}
                parts.append(out)
                pending.append(_media_part(state, part, where, out))
            entry["content"] = parts
        messages.append(entry)
    results = await asyncio.gather(*pending, return_exceptions=True)
    for r in results:  # the first bad part in message order names the error
        if isinstance(r, BaseException):
            raise r
    template = {
        **(body.chat_template_kwargs or {}),
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message,
    }  # the top-level flags win, as in vLLM
    prompt: dict[str, Any] = {"messages": messages, "chat_template_kwargs": template}
    if body.mm_processor_kwargs:
        prompt["mm_processor_kwargs"] = body.mm_processor_kwargs
    return prompt


async def _media_part(state: ServerState, part: Any, where: str, out: dict[str, Any]) -> None:
    """Fills ``out`` with the part's media, decoded within the limits, as vLLM's part of the same type in the
    model's form (audio at the model's rate, RGB images: media.model_form_part)."""
    limits = state.media
    rate = model_audio_rate(state.engine.model)
    if part.type == "input_audio":
        field = f"{where}.input_audio"
        data = decode_base64(part.input_audio.data, f"{field}.data", limits)
        out.update(await asyncio.to_thread(model_form_part, "input_audio", data, field, limits, rate))
        return
    field = f"{where}.{part.payload}"  # as the caller named it (``image`` in the short form)
    url = part.url()
    got = await fetch_media(url, field, limits)
    # the declared type too: a 415 if not its kind
    out.update(await asyncio.to_thread(model_form_part, part.type, got.data, field, limits, rate, got.mime, url))


async def _decoded_prompt(state: ServerState, body: ChatCompletionRequest) -> dict[str, Any]:
    """For pipelines that start with a non-llm stage: the last user text and the decoded media."""
    limits = state.media
    mm: dict[str, list[Any]] = {"image": [], "audio": [], "video": []}
    user_text = None
    for i, msg in enumerate(body.messages):
        content: Any = msg.content
        texts: list[str] = []
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if part.type in ("text", "input_text"):
                    texts.append(part.text)
                elif part.type == "image_url":
                    mm["image"].append(await load_image(part.url(), f"{where}.{part.payload}", limits))
                elif part.type == "audio_url":
                    mm["audio"].append(await load_audio(part.url(), f"{where}.{part.payload}", limits))
                elif part.type == "input_audio":
                    data = decode_base64(part.input_audio.data, f"{where}.input_audio.data", limits)
                    mm["audio"].append(await asyncio.to_thread(audio_from_bytes, data, f"{where}.input_audio", limits))
                elif part.type == "video_url":
                    mm["video"].append(await load_video(part.url(), f"{where}.{part.payload}", limits))
        if msg.role == "user" and texts:
            user_text = "\n".join(texts)
    if user_text is None:
        raise bad_request("messages: no user message with text content", "messages")
    prompt: dict[str, Any] = {"prompt": user_text}
    multi_modal = {k: (v[0] if len(v) == 1 else v) for k, v in mm.items() if v}
    if multi_modal:
        prompt["multi_modal_data"] = multi_modal
    if body.negative_prompt:
        prompt["negative_prompt"] = body.negative_prompt
    return prompt
