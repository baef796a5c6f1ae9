"""Video jobs in a fleet of front-ends sharing one job store (docs/fleet.md): the leases this front-end holds on
the jobs it runs, and the take-over of a job whose front-end died: run again from its stored request, or
failed saying why."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from omnistage.errors import InvalidRequestError
from omnistage.server.errors import APIError
from omnistage.server.fleet import JobLeases
from omnistage.server.jobs import Claimed
from omnistage.server.media import load_image, load_video
from omnistage.server.protocol import VideoJob, VideoRequest
from omnistage.server.state import ServerState
from omnistage.server.video_jobs import KIND, launch_job, record_job
from omnistage.server.video_request import VideoInputs, plan_video

logger = logging.getLogger("omnistage.server")

INTERRUPTED = {"code": "server_restarted", "message": "the server stopped while this job was running; submit it again"}


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
            got = VideoInputs()
            if body.image_reference is not None:
                got.image = await load_image(body.reference_url(), "image_reference", state.media)
            if body.video_reference is not None:
                got.video = await load_video(body.video_url(), "video_reference", state.media)
            req = plan_video(state, body, got, job.id)
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
        await record_job(state, job)
        state.leases.held.discard(job.id)
        logger.warning("video job %s: %s", job.id, why)
        return
    job.status, job.progress, job.error = "queued", 0, None
    state.videos[job.id] = job
    await record_job(state, job)
    launch_job(state, job, req, slot, body, None)
