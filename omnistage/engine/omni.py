"""Omni: the synchronous offline entry point (list of prompts in, list of outputs out).

It drives an AsyncOmni on a private event loop in a background thread, so
all prompts of one call are in flight together and batch in the engines.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from omnistage.engine.async_omni import AsyncOmni
from omnistage.engine.duplex import SyncDuplexSession
from omnistage.outputs import OmniRequestOutput


class Omni:
    def __init__(self, model: str | None = None, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="omni-loop", daemon=True)
        self._thread.start()
        try:
            self._engine = self._call(_make(model, kwargs))
            self._call(self._engine.start())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def engine(self) -> AsyncOmni:
        return self._engine

    @property
    def pipeline(self):
        return self._engine.pipeline

    @property
    def default_sampling_params_list(self) -> list[dict[str, Any]]:
        return self._engine.default_sampling_params_list

    def generate(
        self,
        prompts: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]],
        sampling_params_list: Sequence[Any] | None = None,
        *,
        use_tqdm: bool = True,
        output_modalities: Sequence[str] | None = None,
    ) -> list[OmniRequestOutput]:
        """One output per prompt (final stages merged). A request that fails has ``error`` set;
        invalid input raises ``ValueError`` before anything runs."""
        if isinstance(prompts, (str, Mapping)):
            prompts = [prompts]
        requests = [self._engine.make_request(p, None, sampling_params_list, output_modalities) for p in prompts]
        for req in requests:
            req.stream = False  # the final outputs alone are returned (stages may skip making deltas)
        return self._call(self._run_all(requests, use_tqdm))

    async def _run_all(self, requests: list, use_tqdm: bool) -> list[OmniRequestOutput]:
        bar = tqdm(total=len(requests), unit="req", disable=not use_tqdm, dynamic_ncols=True)
        steps: dict[str, tuple[int, int]] = {}

        async def one(req) -> OmniRequestOutput:
            finals: dict[int, OmniRequestOutput] = {}
            try:
                async for out in self._engine.run(req):
                    if out.progress is not None:
                        steps[req.request_id] = out.progress
                        done, total = map(sum, zip(*steps.values()))
                        bar.set_postfix_str(f"steps {done}/{total}", refresh=True)
                    if out.finished:
                        finals[out.stage_id] = out
            except ValueError:
                raise
            except Exception as e:
                return OmniRequestOutput(req.request_id, -1, "", True, error=str(e))
            finally:
                bar.update(1)
            return merge_outputs(list(finals.values()))

        try:
            return list(await asyncio.gather(*(one(r) for r in requests)))
        finally:
            bar.close()

    def open_duplex(self, sampling_params: Any = None, session_id: str | None = None) -> SyncDuplexSession:
        """A full-duplex session (``AsyncOmni.open_duplex``) for synchronous scripts."""
        return SyncDuplexSession(self._call, self._call(self.engine.open_duplex(sampling_params, session_id)))

    def close(self) -> None:
        if self._loop.is_running():
            try:
                self._call(self._engine.shutdown())
            finally:
                self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _make(model: str | None, kwargs: dict) -> AsyncOmni:
    return AsyncOmni(model, **kwargs)  # constructed on the loop that will run it


def merge_outputs(outputs: list[OmniRequestOutput]) -> OmniRequestOutput:
    """Combine one request's final outputs from several final stages (e.g. text + image)."""
    outputs = sorted(outputs, key=lambda o: o.stage_id)
    merged = outputs[-1]
    for o in outputs[:-1]:
        for name in ("text", "token_ids", "audio", "sample_rate", "video", "fps", "latents", "actions"):
            if getattr(merged, name) is None and getattr(o, name) is not None:
                setattr(merged, name, getattr(o, name))
                if name == "actions":  # its domain and step rate come with it
                    merged.action_domain, merged.action_fps = o.action_domain, o.action_fps
        if not merged.images and o.images:
            merged.images = o.images
        merged.metrics = {**o.metrics, **merged.metrics}
    merged.final_output_type = "+".join(o.final_output_type for o in outputs)
    return merged
