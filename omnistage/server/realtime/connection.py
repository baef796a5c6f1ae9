"""One /v1/realtime session's event loop: client events in order, one response at a time generated beside
them (a chat or speech request streamed as deltas), cancelled by ``response.cancel``, a barge-in or the
client leaving, which aborts the request in every stage."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from omnistage.server.audio_delta import audio_delta
from omnistage.server.chat_request import build_chat_request
from omnistage.server.errors import APIError, from_engine_error
from omnistage.server.media import b64, pcm16
from omnistage.server.realtime.bodies import chat_body, speech_body
from omnistage.server.realtime.protocol import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    ClientEvent,
    ItemCreate,
    ItemDelete,
    ProtocolError,
    ResponseCancel,
    ResponseCreate,
    SessionUpdate,
    parse,
)
from omnistage.server.realtime.session import ConversationItem, Session, new_id
from omnistage.server.result import Result
from omnistage.server.speech_request import build_speech_request
from omnistage.server.state import ServerState

logger = logging.getLogger("omnistage.server")

# WebSocket close codes (RFC 6455 / IANA registry)
POLICY_VIOLATION = 1008  # no or wrong API key, unknown model, a session past its time limits
UNSUPPORTED = 1003  # a model this route cannot converse with
TRY_AGAIN_LATER = 1013  # --max-realtime-sessions reached
GOING_AWAY = 1001  # the server is shutting down


def _retrieve(task: asyncio.Task) -> None:
    """A response task that failed because its client left has nobody to tell: its error is dropped here."""
    if not task.cancelled():
        task.exception()


def realtime_usage(chat: dict[str, Any]) -> dict[str, Any]:
    """The Realtime API's ``response.usage`` from the chat route's ``usage`` (``Result.usage()``): the same counts
    under the Realtime names. Its input details have no ``video_tokens``: a realtime turn carries no video."""
    prompt, completion = chat["prompt_tokens_details"], chat["completion_tokens_details"]
    return {
        "total_tokens": chat["total_tokens"],
        "input_tokens": chat["prompt_tokens"],
        "output_tokens": chat["completion_tokens"],
        "input_token_details": {k: prompt[k] for k in ("cached_tokens", "text_tokens", "audio_tokens", "image_tokens")},
        "output_token_details": {k: completion[k] for k in ("text_tokens", "audio_tokens")},
    }


@dataclass
class Response:
    """One response being generated: what has been sent so far (a cancel keeps exactly that)."""

    id: str
    item: ConversationItem
    audio: bool  # output_modalities ["audio"]: transcript + audio; else text
    in_conversation: bool
    metadata: dict[str, str] | None = None
    text: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    chat_usage: dict[str, Any] | None = None  # the finished request's usage, as the chat route answers it
    task: asyncio.Task | None = None
    finishing: bool = False  # the closing events are being sent: too late to cancel

    def public(self, status: str, details: dict[str, Any] | None = None, final: bool = False) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": [self.item.public()] if final else [],
            "conversation_id": None,
            "output_modalities": ["audio" if self.audio else "text"],
            "metadata": self.metadata,
            "usage": None,
        }
        if final and self.chat_usage is not None:
            out["usage"] = realtime_usage(self.chat_usage)
        elif final:  # cancelled or failed: the tokens streamed before it ended, no split known
            out["usage"] = {
                "total_tokens": self.prompt_tokens + self.output_tokens,
                "input_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
            }
        return out

    def where(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}


class Connection:
    """The event loop of one WebSocket session (client events in order; a response runs beside it)."""

    def __init__(self, ws: WebSocket, state: ServerState, session: Session, lora: str | None):
        self.ws, self.state, self.session, self.lora = ws, state, session, lora
        self.metrics = state.realtime
        self._send_lock = asyncio.Lock()
        self.response: Response | None = None

    async def send(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "event_id": new_id("event"), **fields}
        async with self._send_lock:  # the response task and the event loop both send
            await self.ws.send_text(json.dumps(event, separators=(",", ":")))
        self.metrics.events.labels("out", kind).inc()

    async def error(self, err: ProtocolError) -> None:
        self.metrics.errors.labels(err.code).inc()
        await self.send("error", error=err.error())

    async def run(self) -> None:
        await self.send("session.created", session=self.session.public())
        options = self.state.options
        limit = options.realtime_max_event_bytes
        ends = None if options.realtime_max_session_s is None else time.monotonic() + options.realtime_max_session_s
        while True:
            idle = options.realtime_idle_timeout_s
            left = math.inf if ends is None else max(0.0, ends - time.monotonic())
            # which limit this wait runs into, decided now: asyncio may fire a timer a clock tick early, so
            # reading the clock after the timeout could blame the idle limit for the session's
            over = left <= (idle if idle is not None else math.inf)
            wait = min(left, idle if idle is not None else math.inf)
            try:
                message = await asyncio.wait_for(self.ws.receive(), None if wait == math.inf else wait)
            except (WebSocketDisconnect, RuntimeError):
                return
            except TimeoutError:
                if not over and self.response is not None:  # answering is not idle
                    continue
                await self._expire(over)
                return
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("text")
            frame = frame if frame is not None else message.get("bytes") or b""
            event: ClientEvent | None = None
            try:
                event = parse(frame, limit)
                self.metrics.events.labels("in", event.type).inc()
                await self.handle(event)
            except ProtocolError as e:
                await self.error(e)
            except (WebSocketDisconnect, OSError):
                return
            except Exception as e:  # noqa: BLE001 - a fault handling one event must not end the session
                logger.exception("realtime session %s: event failed", self.session.id)
                err = from_engine_error(e)
                await self.error(
                    ProtocolError(
                        err.message,
                        err.param,
                        err.code or "server_error",
                        event.event_id if event is not None else None,
                        type=err.type,
                    )
                )

    async def _expire(self, session_over: bool) -> None:
        """Past --realtime-max-session-seconds or --realtime-idle-timeout: say which, then close."""
        o = self.state.options
        if session_over:
            err = ProtocolError(
                f"the session reached this server's limit of {o.realtime_max_session_s:g} s "
                "(--realtime-max-session-seconds)",
                None,
                "session_expired",
            )
        else:
            err = ProtocolError(
                f"no client event for {o.realtime_idle_timeout_s:g} s (--realtime-idle-timeout)", None, "idle_timeout"
            )
        await self.close()  # a response still running is aborted first
        try:
            await self.error(err)
            await self.ws.close(POLICY_VIOLATION)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def close(self) -> None:
        """The client left (or the server closes): the running response is aborted in every stage."""
        if self.response is not None and self.response.task is not None:
            self.response.task.cancel()
            await asyncio.gather(self.response.task, return_exceptions=True)
            self.response = None
        self.state.engine.end_session(self.session.id)

    # ------------------------------------------------------------------ client events

    async def handle(self, event: ClientEvent) -> None:
        eid = event.event_id
        s = self.session
        if isinstance(event, SessionUpdate):
            s.update(event.session, eid)
            await self.send("session.updated", session=s.public())
        elif isinstance(event, AudioAppend):
            pcm = s.append_audio(event.audio, eid)
            if s.vad is not None:
                for kind, ms in await asyncio.to_thread(s.detect, pcm):
                    await (self._speech_started(ms) if kind == "start" else self._speech_stopped(ms))
                s.trim_idle()
        elif isinstance(event, AudioCommit):
            item = await asyncio.to_thread(s.commit_audio, eid)  # resampling: off the event loop
            previous = s.insert(item, None, eid)
            await self.send("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
            await self._item_added(item, previous)
        elif isinstance(event, AudioClear):
            s.clear_audio()
            await self.send("input_audio_buffer.cleared")
        elif isinstance(event, ItemCreate):
            item = await asyncio.to_thread(s.item_from, event.item, "item", eid)
            previous = s.insert(item, event.previous_item_id, eid)
            await self._item_added(item, previous)
        elif isinstance(event, ItemDelete):
            if self.response is not None and event.item_id == self.response.item.id:
                raise ProtocolError(
                    "item_id: the item of the response in progress; cancel the response first",
                    "item_id",
                    "invalid_value",
                    eid,
                )
            s.delete(event.item_id, eid)
            await self.send("conversation.item.deleted", item_id=event.item_id)
        elif isinstance(event, ResponseCreate):
            await self.create_response(event)
        elif isinstance(event, ResponseCancel):
            active = self.response
            if active is None or (event.response_id is not None and event.response_id != active.id):
                raise ProtocolError(
                    "no response in progress" + (f" with id {event.response_id!r}" if event.response_id else ""),
                    "response_id" if event.response_id else None,
                    "response_cancel_not_active",
                    eid,
                )
            await self.cancel(active, "client_cancelled")

    async def _speech_started(self, ms: int) -> None:
        item_id, start_ms = self.session.speech_started(ms)
        await self.send("input_audio_buffer.speech_started", audio_start_ms=start_ms, item_id=item_id)
        td = self.session.turn_detection or {}
        if self.response is not None and td.get("interrupt_response", True):  # barge-in
            await self.cancel(self.response, "turn_detected")

    async def _speech_stopped(self, ms: int) -> None:
        s = self.session
        item_id = s.turn[0] if s.turn is not None else None
        item = await asyncio.to_thread(s.speech_stopped, ms)
        await self.send("input_audio_buffer.speech_stopped", audio_end_ms=ms, item_id=item_id)
        if item is None:
            return
        previous = s.insert(item, None, None)
        await self.send("input_audio_buffer.committed", item_id=item.id, previous_item_id=previous)
        await self._item_added(item, previous)
        if (s.turn_detection or {}).get("create_response", True) and self.response is None:
            await self.create_response(ResponseCreate(type="response.create"))

    async def _item_added(self, item: ConversationItem, previous: str | None) -> None:
        await self.send("conversation.item.added", item=item.public(), previous_item_id=previous)
        await self.send("conversation.item.done", item=item.public(), previous_item_id=previous)

    # ------------------------------------------------------------------ responses

    async def create_response(self, event: ResponseCreate) -> None:
        eid = event.event_id
        if self.response is not None:
            raise ProtocolError(
                f"response {self.response.id!r} is in progress; cancel it or wait for response.done",
                None,
                "conversation_already_has_active_response",
                eid,
            )
        params = event.response
        rid = new_id("resp")
        spoken: str | None = None  # a speech model's transcript: the text it speaks
        try:
            if self.session.info.chat:
                body = chat_body(self.session, params, eid)
                body.model = self.lora
                req = await build_chat_request(self.state, body, rid)
                audio = "audio" in (body.modalities or [])
            else:
                speech = speech_body(self.session, params, eid)
                speech.model = self.lora
                req = await build_speech_request(self.state, speech, rid)
                audio, spoken = True, speech.input
            req.session_id = self.session.id  # the session's turns go to the replicas holding its state
        except APIError as e:  # what the HTTP route would answer 400 for, as an error event
            raise ProtocolError(e.message, e.param, e.code or "invalid_request_error", eid) from None
        item = ConversationItem(new_id("item"), "assistant", [], [], status="in_progress")
        resp = Response(
            rid,
            item,
            audio,
            params is None or params.conversation != "none",
            metadata=params.metadata if params is not None else None,
        )
        self.response = resp
        previous = self.session.insert(item, None, eid) if resp.in_conversation else None
        await self.send("response.created", response=resp.public("in_progress"))
        await self.send("response.output_item.added", response_id=rid, output_index=0, item=item.public())
        if resp.in_conversation:
            await self.send("conversation.item.added", item=item.public(), previous_item_id=previous)
        part = {"type": "audio", "transcript": ""} if audio else {"type": "text", "text": ""}
        await self.send("response.content_part.added", part=part, **resp.where())
        if spoken is not None:
            resp.text = spoken
            await self.send("response.output_audio_transcript.delta", delta=spoken, **resp.where())
        resp.task = asyncio.create_task(self._generate(resp, req, eid), name=f"realtime-{rid}")
        resp.task.add_done_callback(_retrieve)

    async def _generate(self, resp: Response, req: Any, eid: str | None) -> None:
        state = self.state
        text_stages = state.text_stages()
        result = Result()
        delta_kind = "response.output_audio_transcript.delta" if resp.audio else "response.output_text.delta"
        try:
            # closed on every way out (a cancel may land while a delta is being sent, outside the stream): that
            # aborts the request in every stage now, not when the generator is collected
            async with contextlib.aclosing(state.stream(req)) as outs:
                async for out in outs:
                    text = out.delta.get("text")
                    if isinstance(text, str) and text:
                        if out.num_tokens is not None:
                            resp.output_tokens = max(resp.output_tokens, out.num_tokens)
                        await self.send(delta_kind, delta=text, **resp.where())
                        resp.text += text  # once sent: a cancel keeps what the client has
                    resp.prompt_tokens = max(resp.prompt_tokens, out.num_prompt_tokens or 0)
                    arr = audio_delta(out)
                    if arr is not None and resp.audio:
                        await self.send("response.output_audio.delta", delta=b64(pcm16(arr)), **resp.where())
                    if out.finished:
                        result.add(out, text_stages)
        except asyncio.CancelledError:
            raise  # cancel(): the stream's cleanup aborted the request; cancel() ends the response
        except Exception as e:  # noqa: BLE001 - a failed request fails this response, not the session
            err = from_engine_error(e)
            await self.error(ProtocolError(err.message, err.param, err.code or "server_error", eid, type=err.type))
            await self._finish(
                resp,
                "failed",
                {"type": "failed", "error": {"type": err.type, "code": err.code, "message": err.message}},
            )
            return
        state.record(result)
        resp.chat_usage = result.usage()
        incomplete = result.finish_reason == "length"
        await self._finish(
            resp,
            "incomplete" if incomplete else "completed",
            {"type": "incomplete", "reason": "max_output_tokens"} if incomplete else None,
        )

    async def cancel(self, resp: Response, reason: str) -> None:
        assert resp.task is not None
        if resp.finishing:  # generation is over: it completes as it is
            await asyncio.gather(resp.task, return_exceptions=True)
            return
        resp.task.cancel()
        await asyncio.gather(resp.task, return_exceptions=True)
        await self._finish(resp, "cancelled", {"type": "cancelled", "reason": reason})

    async def _finish(self, resp: Response, status: str, details: dict[str, Any] | None) -> None:
        """The closing events of a response; the assistant item keeps exactly the text that was sent."""
        resp.finishing = True
        item = resp.item
        item.status = "completed" if status == "completed" else "incomplete"
        if resp.audio:
            item.content = [{"type": "output_audio", "transcript": resp.text}]
            part = {"type": "audio", "transcript": resp.text}
            await self.send("response.output_audio.done", **resp.where())
            await self.send("response.output_audio_transcript.done", transcript=resp.text, **resp.where())
        else:
            item.content = [{"type": "output_text", "text": resp.text}]
            part = {"type": "text", "text": resp.text}
            await self.send("response.output_text.done", text=resp.text, **resp.where())
        item.parts = [{"type": "text", "text": resp.text}]
        await self.send("response.content_part.done", part=part, **resp.where())
        await self.send("response.output_item.done", response_id=resp.id, output_index=0, item=item.public())
        if resp.in_conversation:
            await self.send("conversation.item.done", item=item.public(), previous_item_id=None)
        self.response = None  # before response.done: a client may ask for the next one on seeing it
        await self.send("response.done", response=resp.public(status, details, final=True))
