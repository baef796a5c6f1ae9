"""Moshi's duplex stage: ``stages.ar.StepEngine`` stepping every live session one 80 ms frame at a time.

A session is a request that never finishes on its own: its input arrives through ``feed`` as PCM (float32, 24 kHz,
mono; any length, cut into 1920-sample frames here), and each engine step takes one frame from every session whose
next frame has arrived (the others are left out: nothing is invented for them), encodes them with Mimi, runs one
batched temporal step and one batched depth pass, decodes the model's frames and hands each session its own. So a
session's output depends only on its input frames and its seed, never on timing or on the other sessions.

Per-session state lives in slots (``lm.LMSlots``: KV ring, step offset, delay-pattern tokens) plus each session's
recent input audio and output codes (the Mimi windows). A session holds its slot from its first step until it
ends (``feed(..., last=True)``: the frames already sent are still stepped, then it finishes) or is aborted; the
slot is freed before the next model call. Sessions beyond ``max_num_seqs`` wait for a slot.

Params (the request's ``sampling_params``): ``temperature`` / ``top_k`` (audio codes), ``temperature_text`` /
``top_k_text`` (the text stream), ``seed``. Temperature 0 is greedy. Defaults: the authors' ``LMGen`` ones.
``voice`` (a preset in the folder's ``voices/``) with ``instructions`` (the text prompt) conditions the session
the PersonaPlex way (``persona.py``): its prompt steps run before its first frame, batched like any frame.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.moshi.config import CHUNK_PERIOD_MS, FRAME_SAMPLES, SAMPLE_RATE, TEXT_PADDING, read_checkpoint
from omnistage.models.moshi.lm import LMSlots, Sampling, load_lm
from omnistage.models.moshi.mimi import StreamingMimi, load_mimi
from omnistage.models.moshi.persona import Voice, find_voice, load_voice, prompt_steps, text_tokens
from omnistage.pipeline import StageContext
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.ar.sampling import request_generator
from omnistage.stages.base import StageRequest

DEFAULTS = {"temperature": 0.8, "top_k": 250, "temperature_text": 0.7, "top_k_text": 25}  # the authors' LMGen
PARAM_KEYS = (*DEFAULTS, "seed", "voice", "instructions")
MAX_FEED_SAMPLES = 10 * SAMPLE_RATE  # one feed holds at most 10 s of audio
END = object()  # ready(): the session ended and every frame it sent was stepped
PROMPT = object()  # ready(): the session's next step is one of its persona prompt's
PROBE_STEPS = 3  # measured steps per batch size at start-up (after the delay pattern fills)


@dataclass
class MoshiModel:
    slots: LMSlots
    mimi: StreamingMimi
    tokenizer: Any = None  # sentencepiece.SentencePieceProcessor, when the folder has one

    def text(self, token: int) -> str:
        """A text token's piece as moshi.server writes it ("▁" is a space); padding writes nothing."""
        if token in TEXT_PADDING or self.tokenizer is None:
            return ""
        return self.tokenizer.id_to_piece(token).replace("\u2581", " ")


@dataclass(eq=False)
class DuplexSession(ARRequest):
    sampling: Sampling = field(default_factory=Sampling)
    slot: int | None = None
    pending: deque = field(default_factory=deque)  # frames [1920] float32 waiting for their step
    partial: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # < one frame, not yet steppable
    audio: deque = field(default_factory=deque)  # recent input frames (Mimi's encoder window)
    codes: deque = field(default_factory=deque)  # recent output codes [dep_q] (Mimi's decoder window)
    ending: bool = False
    prompt: deque = field(default_factory=deque)  # persona.PromptStep still to step, before the first frame


def parse_sampling(params: Any) -> Sampling:
    params = dict(params or {}) if isinstance(params, Mapping) else {}
    values: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = params.get(key)
        value = default if value is None else value
        if key.startswith("temperature"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10:
                raise InvalidRequestError(key, f"expected a number in [0, 10], got {value!r}")
            values[key] = float(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequestError(key, f"expected a non-negative integer, got {value!r}")
            values[key] = value
    seed = params.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise InvalidRequestError("seed", f"expected a non-negative integer, got {seed!r}")
    sampled = max(values["temperature"], values["temperature_text"])
    return Sampling(
        temp=values["temperature"],
        top_k=values["top_k"],
        temp_text=values["temperature_text"],
        top_k_text=values["top_k_text"],
        generator=request_generator(sampled, params.get("seed")),
    )


def pcm_frames(session: DuplexSession, chunk: Mapping[str, Any]) -> list[np.ndarray]:
    """A fed chunk's ``pcm`` (float32 mono at 24 kHz), appended to what was left over -> the whole frames."""
    pcm = chunk.get("pcm")
    if pcm is None:
        return []
    pcm = np.asarray(pcm)
    if pcm.ndim != 1 or not np.issubdtype(pcm.dtype, np.floating):
        raise InvalidRequestError(
            "pcm", f"expected mono float samples at {SAMPLE_RATE} Hz, got {pcm.dtype} {pcm.shape}"
        )
    if pcm.size > MAX_FEED_SAMPLES:
        raise InvalidRequestError("pcm", f"at most {MAX_FEED_SAMPLES} samples per append, got {pcm.size}")
    if not np.isfinite(pcm).all():
        raise InvalidRequestError("pcm", "samples must be finite")
    data = np.concatenate([session.partial, pcm.astype(np.float32)])
    whole = len(data) // FRAME_SAMPLES * FRAME_SAMPLES
    session.partial = data[whole:]
    return [data[i : i + FRAME_SAMPLES] for i in range(0, whole, FRAME_SAMPLES)]


def by_length(windows: list[torch.Tensor]) -> dict[int, list[int]]:
    """Row indices grouped by window length (windows of one length share a Mimi call)."""
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        groups.setdefault(w.shape[-1], []).append(i)
    return groups


class MoshiEngine(StepEngine):
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("moshi needs a model folder")
        super().__init__(ctx)
        self.checkpoint = read_checkpoint(Path(ctx.model))
        self._freed: list[int] = []  # slots of sessions that closed, freed before the next model call
        self._freed_lock = threading.Lock()
        self._step_times: dict[int, deque] = {}  # sessions in a step -> its recent durations (s)
        self._voices: dict[str, Voice] = {}  # voice presets read so far, by path
        self.late_frames = 0  # frames stepped in a step longer than a frame's period (the session fell behind)

    def load_model(self) -> MoshiModel:
        device, dtype = self.device_and_dtype()
        ck = self.checkpoint
        lm = load_lm(ck.lm_weights, ck.lm, device, dtype)
        mimi = load_mimi(ck.mimi_weights, ck.mimi, device, dtype)
        tokenizer = None
        if ck.tokenizer is not None:
            import sentencepiece

            tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(ck.tokenizer))
        self.model = MoshiModel(LMSlots(lm, self.max_batch, device, dtype), StreamingMimi(mimi, ck.lm.dep_q), tokenizer)
        self._probe_step_times()
        return self.model

    def _probe_step_times(self) -> None:
        """Step times of 1, 2, 4, ... up to ``max_batch`` sessions, measured once at start-up on silent input, so
        that admission predicts from real batched steps from the first session on (a linear scale-up of one
        session's step refuses sessions that batching would hold). The slots used are reset when next taken."""
        silence = np.zeros(FRAME_SAMPLES, np.float32)
        sizes = sorted({min(1 << k, self.max_batch) for k in range(self.max_batch.bit_length() + 1)})
        for n in sizes:
            rs = [DuplexSession(StageRequest(f"probe-{i}", {}, None)) for i in range(n)]
            for r in rs:
                r.slot = self.model.slots.take()
            warm = self.model.slots.max_delay + 1  # until the delay pattern fills, the step decodes no audio
            for i in range(warm + PROBE_STEPS):
                for r in rs:
                    r.pending.append(silence)
                started = time.perf_counter()
                self._step_live(rs)
                if i >= warm:
                    self._step_times.setdefault(n, deque(maxlen=16)).append(time.perf_counter() - started)
            for r in rs:
                self.model.slots.release(r.slot)

    def new_request(self, req: StageRequest) -> DuplexSession:
        if not req.stream_inputs:
            raise InvalidRequestError("input", "a moshi session takes its audio as a stream (a duplex session)")
        session = DuplexSession(req, sampling=parse_sampling(req.params))
        session.prompt.extend(self._persona(req.params))
        if req.inputs.get("pcm") is not None:
            session.pending.extend(pcm_frames(session, req.inputs))
        return session

    def _persona(self, params: Any) -> list:
        """The prompt steps of a session asking for a persona (``voice`` and ``instructions``; none without)."""
        params = params if isinstance(params, Mapping) else {}
        # empty fields (Realtime clients often send ``"instructions": ""``) ask for nothing
        voice, instructions = (params.get(k) if params.get(k) != "" else None for k in ("voice", "instructions"))
        if voice is None and instructions is None:
            return []
        if voice is None:  # PersonaPlex always steps a voice first; a text prompt alone has no reference
            raise InvalidRequestError("voice", "a persona takes a voice preset with its instructions")
        path = find_voice(Path(self.ctx.model), voice)
        tokens = text_tokens(self.model.tokenizer, instructions)
        cfg = self.checkpoint.lm
        if str(path) not in self._voices:
            self._voices[str(path)] = load_voice(path, cfg.dim, 1 + cfg.n_q)
        silence, sine = cfg.persona_silence_codes, cfg.persona_sine_codes
        return prompt_steps(self._voices[str(path)], tokens, cfg.delays, cfg.dep_q, silence, sine)

    def add_input(self, r: DuplexSession, chunk: Mapping[str, Any], last: bool) -> None:
        r.pending.extend(pcm_frames(r, chunk))
        r.ending = r.ending or last

    def prefill(self, r: DuplexSession) -> Emit:
        self._release_freed()
        r.slot = self.model.slots.take(persona=bool(r.prompt))
        return Emit(data={"session_started": True})  # the session's handle returns to its caller on this

    def ready(self, r: DuplexSession) -> Any:
        if r.prompt:
            return PROMPT
        if r.pending:
            return r.pending[0]
        return END if r.ending else None

    def _on_close(self, item: DuplexSession) -> None:
        if item.slot is not None:
            with self._freed_lock:
                self._freed.append(item.slot)
            item.slot = None
        super()._on_close(item)

    def slots_held(self) -> int:
        """Slots held by live sessions (a closed session's slot counts as free from the moment it closed)."""
        with self._freed_lock:
            return self.max_batch - len(self.model.slots.free) - len(self._freed)

    def _release_freed(self) -> None:
        with self._freed_lock:
            freed, self._freed = self._freed, []
        for slot in freed:
            self.model.slots.release(slot)

    def step(self, rs: list[DuplexSession], items: list[Any]) -> list[Emit]:
        self._release_freed()
        emits = [Emit(finish="stop") if item is END else Emit() for item in items]
        live = [i for i, item in enumerate(items) if item is not END and rs[i].slot is not None]
        if live:
            started = time.perf_counter()
            for i, emit in zip(live, self._step_live([rs[i] for i in live])):
                emits[i] = emit
            took = time.perf_counter() - started
            self._step_times.setdefault(len(live), deque(maxlen=16)).append(took)
            if took * 1000 > CHUNK_PERIOD_MS:
                self.late_frames += len(live)
        return emits

    def recent_step_seconds(self) -> dict[int, float]:
        """Session count -> the slowest recent step with that many sessions (for /metrics)."""
        return {n: max(times) for n, times in dict(self._step_times).items() if times}

    def step_seconds(self, sessions: int) -> float | None:
        """What one step of ``sessions`` sessions takes: the slowest recent step of that many; when that many
        never stepped together, that of the next larger count measured (a larger batch takes longer), or past
        the largest, its step scaled up linearly (batching only helps, so both overestimate); None before any."""
        times = dict(self._step_times)
        if not times:
            return None
        if sessions in times:
            return max(times[sessions])
        above = [n for n in times if n > sessions]
        if above:
            return max(times[min(above)])
        largest = max(times)
        return max(times[largest]) * sessions / largest

    def _step_live(self, rs: list[DuplexSession]) -> list[Emit]:
        """One frame of each session: Mimi encode, one temporal + depth step, Mimi decode."""
        model = self.model
        window = model.mimi.window
        prompts = [r.prompt.popleft() if r.prompt else None for r in rs]
        heard = [i for i, p in enumerate(prompts) if p is None]
        for i in heard:
            rs[i].audio.append(torch.from_numpy(rs[i].pending.popleft()))
            while len(rs[i].audio) > window:
                rs[i].audio.popleft()
        audio = [torch.cat(list(rs[i].audio)) for i in heard]
        user = torch.zeros(len(rs), model.slots.cfg.dep_q, dtype=torch.long)
        for idx in by_length(audio).values():
            user[[heard[j] for j in idx]] = model.mimi.encode_last(torch.stack([audio[j] for j in idx]))
        for i, p in enumerate(prompts):
            if p is not None:
                user[i] = p.user
        frames = model.slots.step([r.slot for r in rs], user, [r.sampling for r in rs], prompts)
        frames = [None if p is not None and not p.emit else f for f, p in zip(frames, prompts)]
        out_rows = [i for i, f in enumerate(frames) if f is not None]
        for i in out_rows:
            rs[i].codes.append(frames[i][1:])
            while len(rs[i].codes) > window:
                rs[i].codes.popleft()
        codes = {i: torch.stack(list(rs[i].codes), dim=1) for i in out_rows}
        pcm: dict[int, torch.Tensor] = {}
        for idx in by_length([codes[i] for i in out_rows]).values():
            rows_here = [out_rows[j] for j in idx]
            decoded = model.mimi.decode_last(torch.stack([codes[i] for i in rows_here]))
            pcm.update(zip(rows_here, decoded))
        emits = []
        for i in range(len(rs)):
            if prompts[i] is not None and not prompts[i].emit:
                emits.append(Emit())  # a prompt step: what the model drew is discarded
                continue
            data: dict[str, Any] = {"user_codes": user[i].tolist()}
            if frames[i] is not None:
                data.update(
                    audio=pcm[i].numpy(),
                    sample_rate=SAMPLE_RATE,
                    text_token_ids=[int(frames[i][0])],
                    text=model.text(int(frames[i][0])),
                    audio_codes=frames[i][1:].tolist(),
                )
            emits.append(Emit(data=data, tokens=1))
        return emits


def build_duplex_engine(ctx: StageContext) -> MoshiEngine:
    return MoshiEngine(ctx)
