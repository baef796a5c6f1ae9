"""The edges thinker -> talker and talker -> code2wav, whole (async chunk off) and streamed.

thinker -> talker: the talker needs the thinker's rendered prompt ids (its first output),
the reply's token ids as they come, for a media prompt the thinker's ``talker_media`` (hidden states
at the media positions and the grids), and the speaker (the request's ``voice`` /
``speaker``, or the talker's own ``speaker`` sampling param). Streaming forwards every
reply delta at once: the talker starts after the first reply token.

talker -> code2wav: the talker emits one ``token_ids`` row [G codes] per frame; code2wav
takes ``codes`` [G, frames]. Streaming forwards the first ``initial_codec_chunk_frames`` frames as soon as they
exist (default ``INITIAL_CHUNK_FRAMES``: one frame, so the first audio packet does not wait for a whole piece of
talker steps and its decode is the smallest), then every ``chunk_frames`` (default ``CHUNK_FRAMES``; both are
code2wav's sampling params), the rest when the talker finishes. code2wav is causal, so the pieces' audio is the
same whatever their sizes.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.models.shared.omni.edges import _ids, first_chunk
from omnistage.pipeline import chunk_size

CHUNK_FRAMES = 4  # 4 frames = 320 ms of speech at 12.5 Hz
INITIAL_CHUNK_FRAMES = 1  # the first piece: one frame (80 ms), so the first audio packet leaves early


def request_speaker(request: Any) -> str | None:
    """The voice a request asks for: its speech input's ``voice`` (HTTP routes put it there), else None (the
    talker's own ``speaker`` param, or the default speaker)."""
    speech = request.prompt.get("speech")
    return (speech.voice or None) if speech is not None else None


def thinker_to_talker(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Async chunk off: the whole reply at once."""
    prompt = source.get("prompt_token_ids")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]  # an auxiliary key accumulates as a list of items
    media = source.get("talker_media")
    if isinstance(media, list):
        media = media[0] if media else None
    return {
        "prompt_token_ids": _ids(prompt),
        "token_ids": _ids(source.get("token_ids")),
        "speaker": request_speaker(request),
        "media": media,
    }


def thinker_to_talker_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    """Async chunk on: every reply delta as it comes (the first with the prompt ids and the speaker)."""
    chunk = first_chunk(delta, state, request_speaker(request))
    if delta.get("token_ids") is not None:
        chunk["token_ids"] = _ids(delta["token_ids"])
        if delta.get("reply_continues"):  # not the thinker's last tokens (thinker.py): the talker may read them now
            chunk["reply_continues"] = True
    if delta.get("talker_media") is not None:
        chunk["media"] = delta["talker_media"]
    return chunk or None


def talker_to_code2wav(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """The talker's frames as code2wav's ``codes``. A talker that ended before its first frame (the thinker
    stopped on its first token: no turn to speak) hands on no codes, and code2wav then answers no audio: the
    reply is its text alone, not an error."""
    codes = source.get("token_ids")
    if codes is None or len(codes) == 0:
        return {}
    return {"codes": torch.as_tensor(codes).T.contiguous()}


def talker_to_code2wav_chunks(delta: dict[str, Any], request: Any, state: dict[str, Any]) -> dict[str, Any] | None:
    pending: list[torch.Tensor] = state.setdefault("pending", [])
    if delta.get("token_ids") is not None:
        pending.append(torch.as_tensor(delta["token_ids"]))
    frames = sum(p.shape[0] for p in pending)
    if state.get("sent"):
        n = chunk_size(request, 2, "chunk_frames", CHUNK_FRAMES)
    else:
        n = chunk_size(request, 2, "initial_codec_chunk_frames", INITIAL_CHUNK_FRAMES)
    if frames == 0 or (frames < n and not state.get("finished")):
        return None  # at the end with nothing sent: code2wav's last input is empty, so the reply has no audio
    state["sent"] = True
    codes = torch.cat(pending, dim=0).T.contiguous()  # [G, frames]
    pending.clear()
    return {"codes": codes}
