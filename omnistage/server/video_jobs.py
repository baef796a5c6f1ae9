"""A video job's life on the front-end running it: its row in the job store (made, written at each status
change and, at most every ``PROGRESS_WRITE_S``, its progress, then its end), the task that runs it, and its
hand-over to the fleet when this front-end stops before the job ends (docs/fleet.md)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from omnistage.engine.request import OmniRequest
from omnistage.modality import OutputModality
from omnistage.server.admission import Slot
from omnistage.server.errors import APIError, from_engine_error
from omnistage.server.jobs import StoreUnavailable
from omnistage.server.media import encode_mp4
from omnistage.server.protocol import VideoJob, VideoRequest
from omnistage.server.result import action_fields
from omnistage.server.state import ServerState
from omnistage.server.video_request import VideoInputs, video_warnings

logger = logging.getLogger("omnistage.server")

KIND = "video"  # its rows in the job store
ACTION_KEYS = ("actions", "action_domain", "action_fps")
PROGRESS_WRITE_S = 0.5  # progress reaches the job store (other front-ends) at most this often


def _file(job: VideoJob) -> str | None:
    return f"{job.id}.mp4" if job.status == "completed" else None


async def record_job(state: ServerState, job: VideoJob) -> bool:
    """Write the state of a job this front-end runs; False when it no longer holds it (deleted elsewhere, or
    taken over after its lease expired): nothing is written then."""
    return await state.jobs.update(job.id, state.leases.owner, job.status, job.model_dump(), _file(job))


def stored_request(body: VideoRequest, got: VideoInputs) -> dict[str, Any]:
    """What another front-end needs to run the job again: the fields as sent (media inputs sent as files are
    not kept: such a job is failed, not re-run, when its front-end dies)."""
    uploaded = got.image is not None and body.image_reference is None
    uploaded |= got.video is not None and body.video_reference is None
    uploaded |= got.mask is not None
    return {"body": body.model_dump(mode="json", exclude_unset=True), "uploads": uploaded}


def launch_job(
    state: ServerState, job: VideoJob, req: OmniRequest, slot: Slot, body: VideoRequest, taken: asyncio.Future | None
) -> asyncio.Task:
    """Run the job in a task the server keeps (and a DELETE of the job cancels)."""
    task = asyncio.create_task(_run_job(state, job, req, slot, body, taken), name=job.id)
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    state.video_tasks[job.id] = task
    task.add_done_callback(lambda _: state.video_tasks.pop(job.id, None))
    return task


def new_job_id() -> str:
    """``video_`` and 32 hex digits: the creation time in microseconds, then random ones. Ids sort as the
    jobs were made (to the microsecond, on every front-end), which orders the listing of jobs made within
    the same second of ``created_at``."""
    return f"video_{time.time_ns() // 1000:013x}{uuid.uuid4().hex[:19]}"


def checked_when_taken(state: ServerState) -> bool:
    """Whether the video comes from a (generic) diffusion stage: it checks a request when it takes it and says
    so at once (its first update, stages/diffusion/engine.py). Other stage kinds check nothing up front, so
    a job there is made without waiting."""
    finals = [s for s in state.engine.pipeline.stages if s.final]
    return any(
        s.kind == "diffusion" and s.engine is None and OutputModality.VIDEO in made
        for s, made in zip(finals, state.engine.final_output_types())
    )


async def register_job(state: ServerState, job: VideoJob, stored: dict[str, Any]) -> None:
    """Make the job's row, held by this front-end, with the request another front-end would re-run it from."""
    state.videos[job.id] = job
    state.leases.held.add(job.id)
    try:
        await state.jobs.put(
            KIND,
            job.id,
            job.status,
            job.created_at,
            job.model_dump(),
            _file(job),
            owner=state.leases.owner,
            lease_until=state.leases.lease_until(),
            request=stored,
        )
    except BaseException:
        state.videos.pop(job.id, None)
        state.leases.held.discard(job.id)
        raise


@dataclass
class _Made:
    """What the job's final outputs brought (the last of each kind counts) and their stages' metrics."""

    video: Any = None
    fps: float | None = None
    audio: Any = None
    sample_rate: int | None = None
    actions: dict[str, Any] | None = None
    metrics: dict[int, dict[str, float]] = field(default_factory=dict)

    def take(self, out: Any) -> None:
        self.metrics.update(out.metrics or {})
        if out.video is not None:
            self.video, self.fps = out.video, out.fps
        if out.audio is not None:
            self.audio, self.sample_rate = out.audio, out.sample_rate
        self.actions = action_fields(out.actions, out.action_domain, out.action_fps) or self.actions


async def _run_job(
    state: ServerState, job: VideoJob, req: OmniRequest, slot: Slot, body: VideoRequest, taken: asyncio.Future | None
) -> None:
    """Run the job to its end; ``taken`` (when the POST waits for the stage's verdict) gets the first update,
    or the error that ended the request before any."""
    start = time.monotonic()
    made = _Made()
    written = time.monotonic()
    handover = False  # the server stops before the job ends: the fleet gets it back rather than a failure
    try:
        async for out in state.stream(req, slot=slot):
            if taken is not None and not taken.done():
                taken.set_result(None)
            if job.status == "queued" and not (out.progress is not None and out.progress[0] == 0):
                job.status = "in_progress"  # (a step done or data; (0, n) only says the stage took it)
                await record_job(state, job)
            if out.progress is not None and out.progress[1]:
                job.progress = min(99, int(100 * out.progress[0] / out.progress[1]))
                if time.monotonic() - written >= PROGRESS_WRITE_S:  # other front-ends see it move too
                    written = time.monotonic()
                    await record_job(state, job)
            if out.finished:
                made.take(out)
        await _complete(state, job, body, req, made, start)
    except asyncio.CancelledError:
        handover = state.admission.closing  # stopped by the server's shutdown, not deleted
        job.status = "failed"
        job.error = {"code": "cancelled", "message": "the job was cancelled"}
        raise
    except Exception as e:  # noqa: BLE001 - a failed job reports its error; the server carries on
        if taken is not None and not taken.done():
            taken.set_exception(e)  # refused before the stage took it: the POST answers it, no job exists
            return
        err = from_engine_error(e)
        handover = state.admission.closing and err.code == "shutting_down"  # cut at the shutdown's grace end
        job.status = "failed"
        job.error = {"code": err.code or err.type, "message": err.message}
        if not handover:
            logger.warning("video job %s failed: %s", job.id, err.message)
    finally:
        slot.release()
        state.video_tasks.pop(job.id, None)
        if job.id in state.videos:  # (a job deleted here is gone with its record)
            # the shutdown waits for this write before it closes the store, even when it cancels this task
            end = _hand_over(state, job) if handover else _finish(state, job)
            await asyncio.shield(state.leases.write(end))


async def _complete(
    state: ServerState, job: VideoJob, body: VideoRequest, req: OmniRequest, made: _Made, start: float
) -> None:
    """The MP4 saved to the media store, and what the job made written into it (not yet to the job store)."""
    if made.video is None:
        raise APIError(500, "the pipeline finished without a video", code="no_output")
    data = await asyncio.to_thread(encode_mp4, made.video, made.fps or 8, made.audio, made.sample_rate)
    await state.storage.save(f"{job.id}.mp4", data)
    state.metrics.videos.inc()
    job.warnings = video_warnings(state, body, req, made.video) or None
    if made.actions is not None:
        job.actions, job.action_domain, job.action_fps = (made.actions[k] for k in ACTION_KEYS)
    if body.return_stage_metrics:
        job.stage_metrics = {str(k): v for k, v in made.metrics.items()}
    job.status, job.progress = "completed", 100
    job.completed_at = int(time.time())
    job.inference_time_s = round(time.monotonic() - start, 3)
    if state.storage.ttl is not None:
        job.expires_at = job.completed_at + state.storage.ttl


async def _hand_over(state: ServerState, job: VideoJob) -> None:
    """A job this front-end is stopping before it ends: queued again, unowned, for the next front-end that
    looks to run from its stored request (or to fail, saying why, when its inputs were uploaded)."""
    job.status, job.progress, job.error = "queued", 0, None
    try:
        await state.leases.release(job.id, job.model_dump())
    except StoreUnavailable as e:  # its lease runs out instead: another front-end takes it over then
        logger.warning("video job %s: could not be handed over: %s", job.id, e)
    finally:
        state.leases.held.discard(job.id)
        state.videos.pop(job.id, None)


async def _finish(state: ServerState, job: VideoJob) -> None:
    """Write the job's final state; a job deleted on another front-end meanwhile leaves no file behind."""
    try:
        if not await record_job(state, job) and job.status == "completed" and await state.jobs.get(job.id) is None:
            await state.storage.delete(f"{job.id}.mp4")
    except StoreUnavailable as e:  # its lease runs out: another front-end (or this one) takes it over
        logger.warning("video job %s: its end could not be recorded: %s", job.id, e)
    finally:
        state.leases.held.discard(job.id)
        state.videos.pop(job.id, None)
