"""Video generation: async jobs (POST/GET/DELETE /v1/videos, content as MP4)
and POST /v1/videos/sync returning the MP4 directly.

Generic over pipelines: any pipeline whose outputs include video serves these
routes. Job outputs live in the media store (storage.py: a folder or S3; TTL,
bounded file concurrency); job ids are validated, so no id can name another key.
Every job is a row of the job store (jobs.py: SQLite or Redis), written at each
status change and read by every front-end sharing the store: any of them lists,
polls, fetches and deletes any job. The front-end running a job holds a lease on
it (fleet.py); a job whose front-end died is re-run from its stored request by
another one, or failed saying why (docs/fleet.md).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from omnistage.engine.request import OmniRequest
from omnistage.errors import InvalidRequestError
from omnistage.modality import OutputModality
from omnistage.params import DiffusionSamplingParams, denoising_stages
from omnistage.server.admission import Slot
from omnistage.server.deps import get_state
from omnistage.server.errors import (
    APIError,
    bad_request,
    describe_validation,
    error_responses,
    from_engine_error,
)
from omnistage.server.fleet import JobLeases
from omnistage.server.jobs import Claimed, StoreUnavailable
from omnistage.server.media import encode_mp4, image_from_bytes, load_image, load_video, too_large, video_from_bytes
from omnistage.server.media_response import stored_file
from omnistage.server.middleware import request_id
from omnistage.server.openapi import request_body, success
from omnistage.server.param_names import as_sent
from omnistage.server.prompt_warnings import warning_headers
from omnistage.server.protocol import VideoJob, VideoRequest
from omnistage.server.result import action_fields
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")
_JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")


# --------------------------------------------------------------------------- parsing


@dataclass
class _Inputs:
    """The media a request brought, decoded, and the fields they came in (an error names those)."""

    image: Any = None
    video: Any = None  # uint8 [T, H, W, 3]
    mask: Any = None  # uint8 [T, H, W, 3]: which pixels of the input video to regenerate (white) or keep (black)
    image_field: str = "image_reference"
    video_field: str = "video_reference"


async def _parse(request: Request, state: ServerState) -> tuple[VideoRequest, _Inputs]:
    """(validated fields, the decoded reference image / input video) from JSON or multipart. An uploaded
    ``input_reference`` is the reference image, or the input video when its content type is ``video/*`` (the
    OpenAI client's reference asset); ``video_reference`` is the input video as a file or a URL; ``mask``, a video
    file, masks it (a model that declares ``video_mask``)."""
    ctype = request.headers.get("content-type", "")
    upload = video_upload = mask_upload = None
    got = _Inputs()
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):  # (a form without files)
        form = await request.form(max_files=3, max_fields=100)
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == "input_reference":
                if not isinstance(value, UploadFile):
                    raise bad_request(
                        "input_reference: expected a file upload (send URLs as image_reference)", "input_reference"
                    )
                if (value.content_type or "").startswith("video/"):
                    video_upload, got.video_field = _one_video(video_upload, value, key), key
                else:
                    upload, got.image_field = value, key
            elif key == "video_reference" and isinstance(value, UploadFile):
                video_upload = _one_video(video_upload, value, key)
            elif key == "mask":
                if not isinstance(value, UploadFile) or mask_upload is not None:
                    raise bad_request("mask: expected one file upload (a video of the input video's frames)", key)
                mask_upload = value
            elif isinstance(value, UploadFile):
                raise bad_request(f"{key}: unexpected file upload", key)
            else:
                fields[key] = value
    elif ctype.startswith("application/json"):
        try:
            fields = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"request body is not valid JSON: {e}") from None
        if not isinstance(fields, dict):
            raise bad_request("request body must be a JSON object")
        if "input_reference" in fields:
            raise bad_request(
                "input_reference: must be a file upload (multipart); send URLs as image_reference", "input_reference"
            )
    else:
        raise APIError(
            415,
            "Content-Type must be multipart/form-data, application/x-www-form-urlencoded or application/json",
            code="unsupported_media_type",
        )
    try:
        body = VideoRequest.model_validate(fields)
    except ValidationError as e:
        msg, param = describe_validation(list(e.errors()))
        raise bad_request(msg, param) from None
    if upload is not None and body.image_reference is not None:
        raise bad_request("input_reference and image_reference: send one reference image, not both", "input_reference")
    if video_upload is not None and body.video_reference is not None:
        raise bad_request(f"{got.video_field} and video_reference: send one input video, not both", got.video_field)
    if (video_upload is not None or body.video_reference is not None) and not state.engine.pipeline.info.video_input:
        raise bad_request(f"{got.video_field}: {state.model_name} takes no input video", got.video_field)
    if mask_upload is not None and not state.engine.pipeline.info.video_mask:
        raise bad_request(f"mask: {state.model_name} takes no mask video", "mask")
    if upload is not None:
        data = await _read(upload, got.image_field, state)
        got.image = await asyncio.to_thread(image_from_bytes, data, got.image_field, state.media, upload.content_type)
    elif body.image_reference is not None:
        got.image = await load_image(body.reference_url(), "image_reference", state.media)
    if video_upload is not None:
        data = await _read(video_upload, got.video_field, state)
        got.video = await asyncio.to_thread(
            video_from_bytes, data, got.video_field, state.media, video_upload.content_type
        )
    elif body.video_reference is not None:
        got.video = await load_video(body.video_url(), "video_reference", state.media)
    if mask_upload is not None:
        data = await _read(mask_upload, "mask", state)
        got.mask = await asyncio.to_thread(video_from_bytes, data, "mask", state.media, mask_upload.content_type)
    return body, got


def _one_video(before: UploadFile | None, upload: UploadFile, field: str) -> UploadFile:
    if before is not None:
        raise bad_request(f"{field}: send one input video (input_reference or video_reference), not two", field)
    return upload


async def _read(upload: UploadFile, field: str, state: ServerState) -> bytes:
    data = await upload.read(state.media.max_bytes + 1)
    if len(data) > state.media.max_bytes:
        raise too_large(field, len(data), state.media.max_bytes)
    return data


def _plan(state: ServerState, body: VideoRequest, got: _Inputs, request_id: str) -> OmniRequest:
    lora = state.check_model(body.model)
    state.require(OutputModality.VIDEO, "video")
    knobs = body.knobs(body.extra_params, where="extra_params")
    if body.seconds is not None and knobs.num_frames is None:
        # the count is the server's: the family takes the nearest one it makes (a warning says which)
        knobs = knobs.model_copy(update={"num_frames": _frames_asked(state, body, knobs), "nearest_frames": True})
    prompt: dict[str, Any] = {"prompt": body.prompt}
    if body.negative_prompt:
        prompt["negative_prompt"] = body.negative_prompt
    mm = {"image": [got.image]} if got.image is not None else {}
    if got.video is not None:
        mm["video"] = got.video
    if got.mask is not None:
        mm["mask"] = got.mask
    if mm:
        prompt["multi_modal_data"] = mm
    # a stage that makes its video's sound too (LTX-2's video+audio) gets both into the MP4; a pipeline whose
    # audio comes from other stages (speech) does not run them for a video
    both = OutputModality.VIDEO | OutputModality.AUDIO
    made = state.engine.final_output_types()
    wanted = ["video", "audio"] if any(t & both == both for t in made) else ["video"]
    if any(OutputModality.VIDEO in t and OutputModality.ACTION in t for t in made):  # a world model's actions
        wanted.append("action")
    return state.make_request(prompt, request_id, output_modalities=wanted, knobs=knobs, lora=lora)


def _frames_asked(state: ServerState, body: VideoRequest, knobs: Any) -> int:
    targets = denoising_stages(state.engine.pipeline)
    default_fps = state.engine.default_sampling_params_list[targets[0]].get("fps") if targets else None
    return max(1, round(body.seconds * (knobs.fps or default_fps or 16)))


def _warnings(state: ServerState, body: VideoRequest, req: OmniRequest, video: Any) -> list[str]:
    """The request's warnings, and the frame count when the family made another than seconds x fps."""
    out = list(req.warnings)
    targets = denoising_stages(state.engine.pipeline)
    params = req.sampling_params[targets[0]] if targets else None
    if not isinstance(params, DiffusionSamplingParams):  # the route builds these for every denoising stage
        return out
    asked = params.num_frames
    if params.nearest_frames and video is not None and asked and len(video) != asked:
        out.append(
            f"seconds={body.seconds:g} x fps={params.fps or '?'} is {asked} frames, a count "
            f"{state.engine.pipeline.name} does not make; it made the nearest, {len(video)}"
        )
    return out


def _as_sent(err: APIError, body: VideoRequest, got: _Inputs) -> APIError:
    """The error in the caller's words (param_names.py): ``seconds``, ``size``, the reference image's and the
    input video's fields."""
    sent = body.model_fields_set | set(body.extra_params or {})
    return as_sent(err, sent, got.image_field, got.video_field)


async def _job_or_404(state: ServerState, video_id: str) -> VideoJob:
    """The job as this front-end runs it (its latest progress), else as the job store has it: any front-end
    sharing the store answers for every job of this model."""
    job = state.videos.get(video_id) if _JOB_ID.match(video_id) else None
    if job is None and _JOB_ID.match(video_id):
        record = await state.jobs.get(video_id)
        job = (
            VideoJob.model_validate(record) if record is not None and record.get("model") == state.model_name else None
        )
    if job is None:
        raise APIError(404, f"video {video_id!r} not found", param="video_id", code="video_not_found")
    return job


# --------------------------------------------------------------------------- the job record

KIND = "video"  # its rows in the job store
ACTION_KEYS = ("actions", "action_domain", "action_fps")
INTERRUPTED = {"code": "server_restarted", "message": "the server stopped while this job was running; submit it again"}
PROGRESS_WRITE_S = 0.5  # progress reaches the job store (other front-ends) at most this often


def _file(job: VideoJob) -> str | None:
    return f"{job.id}.mp4" if job.status == "completed" else None


async def _record(state: ServerState, job: VideoJob) -> bool:
    """Write the state of a job this front-end runs; False when it no longer holds it (deleted elsewhere, or
    taken over after its lease expired): nothing is written then."""
    return await state.jobs.update(job.id, state.leases.owner, job.status, job.model_dump(), _file(job))


def _stored_request(body: VideoRequest, got: _Inputs) -> dict[str, Any]:
    """What another front-end needs to run the job again: the fields as sent (media inputs sent as files are
    not kept: such a job is failed, not re-run, when its front-end dies)."""
    uploaded = got.image is not None and body.image_reference is None
    uploaded |= got.video is not None and body.video_reference is None
    uploaded |= got.mask is not None
    return {"body": body.model_dump(mode="json", exclude_unset=True), "uploads": uploaded}


def start_leases(state: ServerState) -> JobLeases:
    """The leases of this front-end's jobs, and the take-over of jobs of this model whose front-end died."""

    def lost(job_id: str) -> None:
        task = state.video_tasks.get(job_id)
        if task is not None:
            task.cancel()
        state.videos.pop(job_id, None)

    state.leases = JobLeases(
        state.jobs,
        KIND,
        state.settings.job_lease_s,
        on_lost=lost,
        on_claimed=lambda claimed: _take_over(state, claimed),
        # a stopping front-end takes no job: it would hand it straight back
        wanted=lambda record: record.get("model") == state.model_name and not state.admission.closing,
    )
    return state.leases


async def _take_over(state: ServerState, claimed: Claimed) -> None:
    """Run again a job whose front-end stopped (from its stored request), or fail it saying why."""
    job = VideoJob.model_validate(claimed.record)
    stored = claimed.request
    why = None
    if stored is None or stored.get("uploads"):
        why = "the front-end running this job stopped, and its inputs were not kept; submit it again"
    elif claimed.attempts > state.settings.job_max_attempts:
        why = f"the front-ends running this job stopped {claimed.attempts} times; it is not run again"
    req = body = None
    if why is None:
        try:
            body = VideoRequest.model_validate(stored["body"])
            got = _Inputs()
            if body.image_reference is not None:
                got.image = await load_image(body.reference_url(), "image_reference", state.media)
            if body.video_reference is not None:
                got.video = await load_video(body.video_url(), "video_reference", state.media)
            req = _plan(state, body, got, job.id)
            slot = state.admission.acquire()
        except APIError as e:
            if e.status_code == 503:  # this front-end is full: the lease expires and another one takes it
                state.leases.held.discard(job.id)
                return
            why = f"the front-end running this job stopped, and running it again failed: {e.message}"
        except (InvalidRequestError, ValidationError, KeyError) as e:
            why = f"the front-end running this job stopped, and running it again failed: {e}"
    if why is not None:
        job.status, job.error = "failed", {**INTERRUPTED, "message": why}
        await _record(state, job)
        state.leases.held.discard(job.id)
        logger.warning("video job %s: %s", job.id, why)
        return
    job.status, job.progress, job.error = "queued", 0, None
    state.videos[job.id] = job
    await _record(state, job)
    _launch(state, job, req, slot, body, None)


def _launch(
    state: ServerState, job: VideoJob, req: OmniRequest, slot: Slot, body: VideoRequest, taken: asyncio.Future | None
) -> asyncio.Task:
    task = asyncio.create_task(_run_job(state, job, req, slot, body, taken), name=job.id)
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    state.video_tasks[job.id] = task
    task.add_done_callback(lambda _: state.video_tasks.pop(job.id, None))
    return task


# --------------------------------------------------------------------------- async jobs


@router.post(
    "/videos",
    responses=error_responses(413, 415),
    openapi_extra=request_body(VideoRequest, {"input_reference": False, "video_reference": False, "mask": False}),
)
async def create_video(request: Request, state: ServerState = Depends(get_state)) -> dict:
    body, got = await _parse(request, state)
    job_id = _new_job_id()
    try:
        req = _plan(state, body, got, job_id)
    except (APIError, InvalidRequestError) as e:
        raise _as_sent(from_engine_error(e), body, got) from None
    slot = state.admission.acquire()
    job = VideoJob(
        id=job_id,
        model=state.model_name,
        prompt=body.prompt,
        size=body.size,
        seconds=None if body.seconds is None else f"{body.seconds:g}",
        warnings=req.warnings or None,
    )
    # the family's own checks (size, frames, ...) run where its stage takes the request: wait for that verdict,
    # so a request /sync would refuse is refused here too (its 400 or 503) and no job is made of it
    taken = asyncio.get_running_loop().create_future() if _checked_when_taken(state) else None
    stored = _stored_request(body, got)
    if taken is None:
        try:
            await _register(state, job, stored)
        except BaseException:  # the job store is down (a 503 naming it): no job, no slot held
            slot.release()
            raise
    task = _launch(state, job, req, slot, body, taken)
    if taken is not None:
        try:
            await taken
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - the stage refused it (or is down): answered like /sync
            raise _as_sent(from_engine_error(e), body, got) from None
        try:
            await _register(state, job, stored)
        except BaseException:
            task.cancel()
            raise
        if task.done():  # (a job may end before its POST does: its record was written final just now)
            state.leases.held.discard(job.id)
            state.videos.pop(job.id, None)
    logger.info("%s: video job %s queued", request_id(request.scope), job.id)
    return job.model_dump()


def _new_job_id() -> str:
    """``video_`` and 32 hex digits: the creation time in microseconds, then random ones. Ids sort as the
    jobs were made (to the microsecond, on every front-end), which orders the listing of jobs made within
    the same second of ``created_at``."""
    return f"video_{time.time_ns() // 1000:013x}{uuid.uuid4().hex[:19]}"


def _checked_when_taken(state: ServerState) -> bool:
    """Whether the video comes from a (generic) diffusion stage: it checks a request when it takes it and says
    so at once (its first update, stages/diffusion/engine.py). Other stage kinds check nothing up front, so
    a job there is made without waiting."""
    finals = [s for s in state.engine.pipeline.stages if s.final]
    return any(
        s.kind == "diffusion" and s.engine is None and OutputModality.VIDEO in made
        for s, made in zip(finals, state.engine.final_output_types())
    )


async def _register(state: ServerState, job: VideoJob, stored: dict[str, Any]) -> None:
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


async def _run_job(
    state: ServerState, job: VideoJob, req: OmniRequest, slot: Slot, body: VideoRequest, taken: asyncio.Future | None
) -> None:
    """Run the job to its end; ``taken`` (when the POST waits for the stage's verdict) gets the first update,
    or the error that ended the request before any."""
    start = time.monotonic()
    video = fps = audio = sample_rate = None
    actions: dict[str, Any] | None = None
    metrics: dict[int, dict[str, float]] = {}
    written = time.monotonic()
    handover = False  # the server stops before the job ends: the fleet gets it back rather than a failure
    try:
        async for out in state.stream(req, slot=slot):
            if taken is not None and not taken.done():
                taken.set_result(None)
            if job.status == "queued" and not (out.progress is not None and out.progress[0] == 0):
                job.status = "in_progress"  # (a step done or data; (0, n) only says the stage took it)
                await _record(state, job)
            if out.progress is not None and out.progress[1]:
                job.progress = min(99, int(100 * out.progress[0] / out.progress[1]))
                if time.monotonic() - written >= PROGRESS_WRITE_S:  # other front-ends see it move too
                    written = time.monotonic()
                    await _record(state, job)
            if out.finished:
                metrics.update(out.metrics or {})
                if out.video is not None:
                    video, fps = out.video, out.fps
                if out.audio is not None:
                    audio, sample_rate = out.audio, out.sample_rate
                actions = action_fields(out.actions, out.action_domain, out.action_fps) or actions
        if video is None:
            raise APIError(500, "the pipeline finished without a video", code="no_output")
        data = await asyncio.to_thread(encode_mp4, video, fps or 8, audio, sample_rate)
        await state.storage.save(f"{job.id}.mp4", data)
        state.metrics.videos.inc()
        job.warnings = _warnings(state, body, req, video) or None
        if actions is not None:
            job.actions, job.action_domain, job.action_fps = (actions[k] for k in ACTION_KEYS)
        if body.return_stage_metrics:
            job.stage_metrics = {str(k): v for k, v in metrics.items()}
        job.status, job.progress = "completed", 100
        job.completed_at = int(time.time())
        job.inference_time_s = round(time.monotonic() - start, 3)
        if state.storage.ttl is not None:
            job.expires_at = job.completed_at + state.storage.ttl
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
        if not await _record(state, job) and job.status == "completed" and await state.jobs.get(job.id) is None:
            await state.storage.delete(f"{job.id}.mp4")
    except StoreUnavailable as e:  # its lease runs out: another front-end (or this one) takes it over
        logger.warning("video job %s: its end could not be recorded: %s", job.id, e)
    finally:
        state.leases.held.discard(job.id)
        state.videos.pop(job.id, None)


@router.get("/videos")
async def list_videos(
    limit: int = Query(20, ge=1, le=100),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    after: str | None = Query(None, description="the last id of the previous page"),
    state: ServerState = Depends(get_state),
) -> dict:
    """One page of this model's jobs from the job store (every front-end sharing it lists the same), by
    creation time; a job this front-end runs shows its latest progress."""
    jobs = [VideoJob.model_validate(r) for r in await state.jobs.load(KIND) if r.get("model") == state.model_name]
    jobs = [state.videos.get(j.id, j) for j in jobs]  # (load is oldest first; ties by id)
    if order == "desc":
        jobs.reverse()
    if after is not None:
        ids = [j.id for j in jobs]
        if after not in ids:
            raise APIError(404, f"after: video {after!r} not found", param="after", code="video_not_found")
        jobs = jobs[ids.index(after) + 1 :]
    return {
        "object": "list",
        "data": [j.model_dump() for j in jobs[:limit]],
        "first_id": jobs[0].id if jobs else None,
        "last_id": jobs[:limit][-1].id if jobs else None,
        "has_more": len(jobs) > limit,
    }


@router.get("/videos/{video_id}")
async def retrieve_video(video_id: str, state: ServerState = Depends(get_state)) -> dict:
    return (await _job_or_404(state, video_id)).model_dump()


@router.get(
    "/videos/{video_id}/content",
    response_class=Response,
    responses={**success("The video (MP4)", "video/mp4"), **error_responses(409, 416)},
)
async def video_content(video_id: str, request: Request, state: ServerState = Depends(get_state)) -> Response:
    """The MP4 from the media store (byte ranges honoured), or a redirect to a presigned URL when the deploy
    asks for one and the store has them."""
    job = await _job_or_404(state, video_id)
    if job.status != "completed":
        raise APIError(
            409, f"video {video_id!r} is {job.status}, not completed", param="video_id", code="video_not_ready"
        )
    name = f"{job.id}.mp4"
    size = await state.storage.size(name)
    if size is None:
        state.videos.pop(job.id, None)
        await state.jobs.delete(job.id)
        raise APIError(404, f"video {video_id!r} has expired", param="video_id", code="video_expired")
    if state.settings.presign_s is not None:
        url = await asyncio.to_thread(state.storage.presign, name, state.settings.presign_s)
        if url is not None:
            return RedirectResponse(url, status_code=307)
    return await stored_file(request, state.storage, name, size, "video/mp4")


@router.delete("/videos/{video_id}")
async def delete_video(video_id: str, state: ServerState = Depends(get_state)) -> dict:
    """Any front-end deletes any job: one running on another front-end is stopped there when it next renews
    its lease and finds the job gone (within a second)."""
    job = await _job_or_404(state, video_id)
    task = state.video_tasks.get(job.id)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await state.jobs.delete(job.id)  # first: a runner elsewhere writes nothing more, and saves no file after
    await state.storage.delete(f"{job.id}.mp4")
    state.videos.pop(job.id, None)
    return {"id": job.id, "object": "video.deleted", "deleted": True}


# --------------------------------------------------------------------------- sync


def _sync_success() -> dict[int | str, dict[str, Any]]:
    """The MP4, or with ``Accept: application/json`` the MP4 (base64) and the actions of a world model."""
    answer = success("The video (MP4), or JSON with the MP4 and its actions (Accept: application/json)", "video/mp4")
    floats = {"type": "array", "items": {"type": "number"}}
    answer[200]["content"]["application/json"] = {
        "schema": {
            "type": "object",
            "required": ["object", "model", "b64_mp4"],
            "properties": {
                "object": {"type": "string"},
                "model": {"type": "string"},
                "b64_mp4": {"type": "string"},
                "actions": {"type": "array", "items": floats},
                "action_domain": {"type": ["string", "null"]},
                "action_fps": {"type": ["number", "null"]},
            },
        }
    }
    return answer


@router.post(
    "/videos/sync",
    response_class=Response,
    responses={**_sync_success(), **error_responses(413, 415)},
    openapi_extra=request_body(VideoRequest, {"input_reference": False, "video_reference": False, "mask": False}),
)
async def create_video_sync(request: Request, state: ServerState = Depends(get_state)) -> Response:
    body, got = await _parse(request, state)
    start = time.monotonic()
    try:
        req = _plan(state, body, got, request_id(request.scope))
        result = await state.run(request, req)
    except (APIError, InvalidRequestError) as e:
        raise _as_sent(from_engine_error(e), body, got) from None
    if result.video is None:
        raise APIError(500, "the pipeline finished without a video", code="no_output")
    data = await asyncio.to_thread(encode_mp4, result.video, result.fps or 8, result.audio, result.sample_rate)
    headers = {"X-Model": state.model_name, "X-Inference-Time-S": f"{time.monotonic() - start:.3f}"}
    warnings = warning_headers(_warnings(state, body, req, result.video))
    if body.return_stage_metrics:  # the body is the MP4 itself: metrics travel as compact JSON in a header
        headers["X-Stage-Metrics"] = json.dumps({str(k): v for k, v in result.metrics.items()}, separators=(",", ":"))
    if _wants_json(request):  # the MP4 and the actions in one answer (actions can outgrow a header)
        answer = {"object": "video", "model": state.model_name, "b64_mp4": base64.b64encode(data).decode()}
        answer.update(result.action_json() or {})
        response = JSONResponse(answer, headers=headers)
    else:
        response = Response(data, media_type="video/mp4", headers=headers)
    for name, value in warnings:
        response.headers.append(name, value)
    return response


def _wants_json(request: Request) -> bool:
    """Whether the caller asked for the JSON answer (``Accept: application/json`` without ``video/mp4``)."""
    accept = request.headers.get("accept", "")
    return "application/json" in accept and "video/mp4" not in accept
