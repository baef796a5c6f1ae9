"""Video generation: async jobs (POST/GET/DELETE /v1/videos, content as MP4)
and POST /v1/videos/sync returning the MP4 directly.

Generic over pipelines: any pipeline whose outputs include video serves these
routes. Job outputs live in the media store (storage.py: a folder or S3; TTL,
bounded file concurrency); job ids are validated, so no id can name another key.
Every job is a row of the job store (jobs.py: SQLite or Redis), written at each
status change and read by every front-end sharing the store: any of them lists,
polls, fetches and deletes any job. The front-end running a job holds a lease on
it (fleet.py); a job whose front-end died is re-run from its stored request by
another one, or failed saying why (docs/fleet.md). The request's parsing is
video_request.py's, a job's life video_jobs.py's, the take-over video_fleet.py's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from omnistage.errors import InvalidRequestError
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, error_responses, from_engine_error
from omnistage.server.media import encode_mp4
from omnistage.server.media_response import stored_file
from omnistage.server.middleware import request_id
from omnistage.server.openapi import request_body, success
from omnistage.server.prompt_warnings import warning_headers
from omnistage.server.protocol import VideoJob, VideoRequest
from omnistage.server.state import ServerState
from omnistage.server.video_jobs import (
    KIND,
    checked_when_taken,
    launch_job,
    new_job_id,
    register_job,
    stored_request,
)
from omnistage.server.video_request import parse_video_request, plan_video, video_error_as_sent, video_warnings

router = APIRouter(prefix="/v1")
logger = logging.getLogger("omnistage.server")
_JOB_ID = re.compile(r"^video_[0-9a-f]{32}$")


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


# --------------------------------------------------------------------------- async jobs


@router.post(
    "/videos",
    responses=error_responses(413, 415),
    openapi_extra=request_body(VideoRequest, {"input_reference": False, "video_reference": False, "mask": False}),
)
async def create_video(request: Request, state: ServerState = Depends(get_state)) -> dict:
    body, got = await parse_video_request(request, state)
    job_id = new_job_id()
    try:
        req = plan_video(state, body, got, job_id)
    except (APIError, InvalidRequestError) as e:
        raise video_error_as_sent(from_engine_error(e), body, got) from None
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
    taken = asyncio.get_running_loop().create_future() if checked_when_taken(state) else None
    stored = stored_request(body, got)
    if taken is None:
        try:
            await register_job(state, job, stored)
        except BaseException:  # the job store is down (a 503 naming it): no job, no slot held
            slot.release()
            raise
    task = launch_job(state, job, req, slot, body, taken)
    if taken is not None:
        try:
            await taken
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - the stage refused it (or is down): answered like /sync
            raise video_error_as_sent(from_engine_error(e), body, got) from None
        try:
            await register_job(state, job, stored)
        except BaseException:
            task.cancel()
            raise
        if task.done():  # (a job may end before its POST does: its record was written final just now)
            state.leases.held.discard(job.id)
            state.videos.pop(job.id, None)
    logger.info("%s: video job %s queued", request_id(request.scope), job.id)
    return job.model_dump()


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
    body, got = await parse_video_request(request, state)
    start = time.monotonic()
    try:
        req = plan_video(state, body, got, request_id(request.scope))
        result = await state.run(request, req)
    except (APIError, InvalidRequestError) as e:
        raise video_error_as_sent(from_engine_error(e), body, got) from None
    if result.video is None:
        raise APIError(500, "the pipeline finished without a video", code="no_output")
    data = await asyncio.to_thread(encode_mp4, result.video, result.fps or 8, result.audio, result.sample_rate)
    headers = {"X-Model": state.model_name, "X-Inference-Time-S": f"{time.monotonic() - start:.3f}"}
    warnings = warning_headers(video_warnings(state, body, req, result.video))
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
