"""Video generation: async jobs (POST/GET/DELETE /v1/videos, content as MP4)
and POST /v1/videos/sync returning the MP4 directly.

Generic over pipelines: any pipeline whose outputs include video serves these
routes. Job files live in FileStorage (TTL, bounded file concurrency); job ids
are validated, so no id can name a path outside the storage folder. Every job
is recorded in the job store (jobs.py) at each status change and read back at
start-up (``restore_jobs``): a restarted server still lists its jobs and serves
the finished ones; jobs the old process was running are marked failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, Response
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
from omnistage.server.media import encode_mp4, image_from_bytes, load_image, too_large
from omnistage.server.middleware import request_id
from omnistage.server.openapi import request_body, success
from omnistage.server.param_names import as_sent
from omnistage.server.prompt_warnings import warning_headers
from omnistage.server.protocol import VideoJob, VideoRequest
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")
_JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")


# --------------------------------------------------------------------------- parsing


async def _parse(request: Request, state: ServerState) -> tuple[VideoRequest, Any]:
    """(validated fields, reference image or None) from JSON or multipart."""
    ctype = request.headers.get("content-type", "")
    upload = None
    if ctype.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):  # (a form without files)
        form = await request.form(max_files=2, max_fields=100)
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key == "input_reference":
                if not isinstance(value, UploadFile):
                    raise bad_request(
                        "input_reference: expected a file upload (send URLs as image_reference)", "input_reference"
                    )
                upload = value
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
    image = None
    if upload is not None:
        data = await upload.read(state.media.max_bytes + 1)
        if len(data) > state.media.max_bytes:
            raise too_large("input_reference", len(data), state.media.max_bytes)
        image = await asyncio.to_thread(image_from_bytes, data, "input_reference", state.media, upload.content_type)
    elif body.image_reference is not None:
        image = await load_image(body.reference_url(), "image_reference", state.media)
    return body, image


def _plan(state: ServerState, body: VideoRequest, image: Any, request_id: str) -> OmniRequest:
    lora = state.check_model(body.model)
    state.require(OutputModality.VIDEO, "video")
    knobs = body.knobs(body.extra_params, where="extra_params")
    if body.seconds is not None and knobs.num_frames is None:
        # the count is the server's: the family takes the nearest one it makes (a warning says which)
        knobs = knobs.model_copy(update={"num_frames": _frames_asked(state, body, knobs), "nearest_frames": True})
    prompt: dict[str, Any] = {"prompt": body.prompt}
    if body.negative_prompt:
        prompt["negative_prompt"] = body.negative_prompt
    if image is not None:
        prompt["multi_modal_data"] = {"image": [image]}
    # a stage that makes its video's sound too (LTX-2's video+audio) gets both into the MP4; a pipeline whose
    # audio comes from other stages (speech) does not run them for a video
    both = OutputModality.VIDEO | OutputModality.AUDIO
    wanted = ["video", "audio"] if any(t & both == both for t in state.engine.final_output_types()) else ["video"]
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


def _as_sent(err: APIError, body: VideoRequest, upload: bool) -> APIError:
    """The error in the caller's words (param_names.py): ``seconds``, ``size``, the reference image's field."""
    sent = body.model_fields_set | set(body.extra_params or {})
    return as_sent(err, sent, "input_reference" if upload else "image_reference")


def _job_or_404(state: ServerState, video_id: str) -> VideoJob:
    job = state.videos.get(video_id) if _JOB_ID.match(video_id) else None
    if job is None:
        raise APIError(404, f"video {video_id!r} not found", param="video_id", code="video_not_found")
    return job


# --------------------------------------------------------------------------- the job record

KIND = "video"  # its rows in the job store
INTERRUPTED = {"code": "server_restarted", "message": "the server stopped while this job was running; submit it again"}


async def _record(state: ServerState, job: VideoJob) -> None:
    file = f"{job.id}.mp4" if job.status == "completed" else None
    await state.jobs.put(KIND, job.id, job.status, job.created_at, job.model_dump(), file)


async def restore_jobs(state: ServerState) -> None:
    """Read this model's recorded jobs back at start-up: finished ones as they were (a completed one whose
    file is gone is dropped), ones that were still running as failed. (Jobs of other models, e.g. of another
    server sharing the storage path, are left alone.)"""
    dropped = []
    for record in await state.jobs.load(KIND):
        job = VideoJob.model_validate(record)
        if job.model != state.model_name:
            continue
        if job.status in ("queued", "in_progress"):
            job.status, job.error = "failed", dict(INTERRUPTED)
            await _record(state, job)
        elif job.status == "completed" and await state.storage.open(f"{job.id}.mp4") is None:
            dropped.append(job.id)  # expired (or deleted) while the server was down
            continue
        state.videos[job.id] = job
    await state.jobs.delete(*dropped)
    if state.videos or dropped:
        logger.info("video jobs: %d restored, %d expired", len(state.videos), len(dropped))


# --------------------------------------------------------------------------- async jobs


@router.post(
    "/videos", responses=error_responses(413, 415), openapi_extra=request_body(VideoRequest, {"input_reference": False})
)
async def create_video(request: Request, state: ServerState = Depends(get_state)) -> dict:
    body, image = await _parse(request, state)
    upload = image is not None and body.image_reference is None
    job_id = f"video_{uuid.uuid4().hex}"
    try:
        req = _plan(state, body, image, job_id)
    except (APIError, InvalidRequestError) as e:
        raise _as_sent(from_engine_error(e), body, upload) from None
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
    if taken is None:
        await _register(state, job)
    task = asyncio.create_task(_run_job(state, job, req, slot, body, taken), name=job.id)
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    if taken is not None:
        try:
            await taken
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - the stage refused it (or is down): answered like /sync
            raise _as_sent(from_engine_error(e), body, upload) from None
        await _register(state, job)
    if not task.done():  # (a job may end before its POST does; its record is already final then)
        state.video_tasks[job.id] = task
    logger.info("%s: video job %s queued", request_id(request.scope), job.id)
    return job.model_dump()


def _checked_when_taken(state: ServerState) -> bool:
    """Whether the video comes from a (generic) diffusion stage: it checks a request when it takes it and says
    so at once (its first update, stages/diffusion/engine.py). Other stage kinds check nothing up front, so
    a job there is made without waiting."""
    finals = [s for s in state.engine.pipeline.stages if s.final]
    return any(
        s.kind == "diffusion" and s.engine is None and OutputModality.VIDEO in made
        for s, made in zip(finals, state.engine.final_output_types())
    )


async def _register(state: ServerState, job: VideoJob) -> None:
    state.videos[job.id] = job
    await _record(state, job)


async def _run_job(
    state: ServerState, job: VideoJob, req: OmniRequest, slot: Slot, body: VideoRequest, taken: asyncio.Future | None
) -> None:
    """Run the job to its end; ``taken`` (when the POST waits for the stage's verdict) gets the first update,
    or the error that ended the request before any."""
    start = time.monotonic()
    video = fps = audio = sample_rate = None
    metrics: dict[int, dict[str, float]] = {}
    try:
        async for out in state.stream(req, slot=slot):
            if taken is not None and not taken.done():
                taken.set_result(None)
            if job.status == "queued" and not (out.progress is not None and out.progress[0] == 0):
                job.status = "in_progress"  # (a step done or data; (0, n) only says the stage took it)
                await _record(state, job)
            if out.progress is not None and out.progress[1]:
                job.progress = min(99, int(100 * out.progress[0] / out.progress[1]))
            if out.finished:
                metrics.update(out.metrics or {})
                if out.video is not None:
                    video, fps = out.video, out.fps
                if out.audio is not None:
                    audio, sample_rate = out.audio, out.sample_rate
        if video is None:
            raise APIError(500, "the pipeline finished without a video", code="no_output")
        data = await asyncio.to_thread(encode_mp4, video, fps or 8, audio, sample_rate)
        await state.storage.save(f"{job.id}.mp4", data)
        state.metrics.videos.inc()
        job.warnings = _warnings(state, body, req, video) or None
        if body.return_stage_metrics:
            job.stage_metrics = {str(k): v for k, v in metrics.items()}
        job.status, job.progress = "completed", 100
        job.completed_at = int(time.time())
        job.inference_time_s = round(time.monotonic() - start, 3)
        if state.storage.ttl is not None:
            job.expires_at = job.completed_at + state.storage.ttl
    except asyncio.CancelledError:
        job.status = "failed"
        job.error = {"code": "cancelled", "message": "the job was cancelled"}
        raise
    except Exception as e:  # noqa: BLE001 - a failed job reports its error; the server carries on
        if taken is not None and not taken.done():
            taken.set_exception(e)  # refused before the stage took it: the POST answers it, no job exists
            return
        err = from_engine_error(e)
        job.status = "failed"
        job.error = {"code": err.code or err.type, "message": err.message}
        logger.warning("video job %s failed: %s", job.id, err.message)
    finally:
        slot.release()
        state.video_tasks.pop(job.id, None)
        if job.id in state.videos:  # (a deleted job's record is gone with it)
            await asyncio.shield(_record(state, job))


@router.get("/videos")
async def list_videos(
    limit: int = Query(20, ge=1, le=100),
    order: str = Query("desc", pattern="^(asc|desc)$"),
    state: ServerState = Depends(get_state),
) -> dict:
    jobs = sorted(state.videos.values(), key=lambda j: j.created_at, reverse=order == "desc")[:limit]
    return {"object": "list", "data": [j.model_dump() for j in jobs], "has_more": len(state.videos) > limit}


@router.get("/videos/{video_id}")
async def retrieve_video(video_id: str, state: ServerState = Depends(get_state)) -> dict:
    return _job_or_404(state, video_id).model_dump()


@router.get(
    "/videos/{video_id}/content",
    response_class=FileResponse,
    responses={**success("The video (MP4)", "video/mp4"), **error_responses(409)},
)
async def video_content(video_id: str, state: ServerState = Depends(get_state)) -> FileResponse:
    job = _job_or_404(state, video_id)
    if job.status != "completed":
        raise APIError(
            409, f"video {video_id!r} is {job.status}, not completed", param="video_id", code="video_not_ready"
        )
    path = await state.storage.open(f"{job.id}.mp4")
    if path is None:
        state.videos.pop(job.id, None)
        await state.jobs.delete(job.id)
        raise APIError(404, f"video {video_id!r} has expired", param="video_id", code="video_expired")
    return FileResponse(path, media_type="video/mp4", filename=f"{job.id}.mp4")


@router.delete("/videos/{video_id}")
async def delete_video(video_id: str, state: ServerState = Depends(get_state)) -> dict:
    job = _job_or_404(state, video_id)
    task = state.video_tasks.get(job.id)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await state.storage.delete(f"{job.id}.mp4")
    state.videos.pop(job.id, None)
    await state.jobs.delete(job.id)
    return {"id": job.id, "object": "video.deleted", "deleted": True}


# --------------------------------------------------------------------------- sync


@router.post(
    "/videos/sync",
    response_class=Response,
    responses={**success("The video (MP4)", "video/mp4"), **error_responses(413, 415)},
    openapi_extra=request_body(VideoRequest, {"input_reference": False}),
)
async def create_video_sync(request: Request, state: ServerState = Depends(get_state)) -> Response:
    body, image = await _parse(request, state)
    upload = image is not None and body.image_reference is None
    start = time.monotonic()
    try:
        req = _plan(state, body, image, request_id(request.scope))
        result = await state.run(request, req)
    except (APIError, InvalidRequestError) as e:
        raise _as_sent(from_engine_error(e), body, upload) from None
    if result.video is None:
        raise APIError(500, "the pipeline finished without a video", code="no_output")
    data = await asyncio.to_thread(encode_mp4, result.video, result.fps or 8, result.audio, result.sample_rate)
    headers = {"X-Model": state.model_name, "X-Inference-Time-S": f"{time.monotonic() - start:.3f}"}
    warnings = warning_headers(_warnings(state, body, req, result.video))
    if body.return_stage_metrics:  # the body is the MP4 itself: metrics travel as compact JSON in a header
        headers["X-Stage-Metrics"] = json.dumps({str(k): v for k, v in result.metrics.items()}, separators=(",", ":"))
    response = Response(data, media_type="video/mp4", headers=headers)
    for name, value in warnings:
        response.headers.append(name, value)
    return response
