"""A vLLM KV connector that hands out a generating engine's hidden states while it runs.

vLLM's public API returns no hidden states from a generating engine. A model that needs some (Qwen3-Omni's
talker reads the thinker's residual stream at the prompt's media positions, Qwen2.5-Omni's the last layer of prompt
and reply) registers a model class whose forward also writes the wanted hidden state of every token it computes
into a cache-only attention layer (vLLM's own ``CacheOnlyAttentionLayer``, the building block of its
``extract_hidden_states`` method: a KV-cache group of its own, one "head" of ``hidden_size`` per token). This
connector, loaded through vLLM's public out-of-tree hook (``kv_transfer_config=hidden.CONNECTOR``), copies the rows
each step computed for a request that asks out of that cache into the request's file, in ``wait_for_save``: vLLM
calls it after the forward and before the step's output leaves the engine, so the rows of every token computed so
far are in the file when an output reaches the caller. (vLLM's ``extract_hidden_states`` itself cannot serve a
request that keeps generating: its "drafts" are always accepted, so every token after the first is wrong;
docs/families/qwen_omni.md.)

Only requests that ask write anything: ``SamplingParams.extra_args["kv_transfer_params"][PATH_KEY]`` names the
file, ``[REPLY_KEY]`` true asks for the reply's rows too (the tokens fed back: all but the last), else the prompt's
only (``hidden.py`` has the names and the reader). The file: the hidden size (int64), then float32 rows, row ``i``
at its place whatever step wrote it (a preempted request that recomputes rewrites the same rows). Only a request's
first rows create the file: once the stage removed it (the request ended or was aborted), later steps write nothing.
Nothing in vLLM is patched.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from omnistage.stages.llm.hidden import HEADER, LAYER, PATH_KEY, REPLY_KEY

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


@dataclass
class _Save:
    path: str
    block_ids: list[int]
    start: int  # rows [start, end) of the request's tokens
    end: int


@dataclass
class _Meta(KVConnectorMetadata):
    saves: list[_Save] = field(default_factory=list)


@dataclass
class _Tracked:
    path: str
    limit: int | None  # the prompt's length (its rows only), or None: every token computed until it finishes
    block_ids: list[int]


def _hidden_group(kv_cache_config: KVCacheConfig | None) -> int:
    """The KV-cache group holding the cache-only layer, found by its name (``LAYER``): vLLM may give it the same
    block table as the model's attention layers, and the scheduler's copy of the config keeps no layer types."""
    found = [
        i
        for i, group in enumerate(kv_cache_config.kv_cache_groups if kv_cache_config is not None else [])
        if any(LAYER in name.split(".") for name in group.layer_names)
    ]
    if len(found) != 1:
        raise ValueError(
            f"expected one KV-cache group with a {LAYER!r} layer, found {len(found)}: the model must "
            f"write its hidden states into a CacheOnlyAttentionLayer named {LAYER}.<n>"
        )
    return found[0]


class HiddenRowsConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._group = _hidden_group(kv_cache_config)
        self._tracked: dict[str, _Tracked] = {}  # scheduler side: asking requests with rows still to write
        self._cache: torch.Tensor | None = None  # worker side: [blocks, 1, block_size, hidden]
        self._writes = True  # worker side: tensor-parallel rank 0 alone writes

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        return 0, False  # nothing to load

    def update_state_after_alloc(self, request: Request, blocks: Any, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        from_start = set()  # new or resumed this step: rows [0, ...) (a cached prefix's rows are in its blocks)
        for new in scheduler_output.scheduled_new_reqs:
            extra = (new.sampling_params.extra_args or {}) if new.sampling_params else {}
            asked = extra.get("kv_transfer_params") or {}
            if asked.get(PATH_KEY) is not None and new.prompt_token_ids is not None:
                limit = None if asked.get(REPLY_KEY) else len(new.prompt_token_ids)
                self._tracked[new.req_id] = _Tracked(asked[PATH_KEY], limit, list(new.block_ids[self._group]))
                from_start.add(new.req_id)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            t = self._tracked.get(req_id)
            new_blocks = cached.new_block_ids[i]
            if t is None or new_blocks is None:
                continue
            if req_id in cached.resumed_req_ids:  # a preempted request comes back with all of its blocks
                t.block_ids = list(new_blocks[self._group])
                from_start.add(req_id)
            else:
                t.block_ids.extend(new_blocks[self._group])
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        meta = _Meta()
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            t = self._tracked.get(req_id)
            if t is None:
                continue
            start = 0 if req_id in from_start else computed.get(req_id, 0)
            end = computed.get(req_id, 0) + n
            if t.limit is not None:
                end = min(end, t.limit)
            if end > start:
                meta.saves.append(_Save(t.path, list(t.block_ids), start, end))
            if t.limit is not None and end >= t.limit:  # the prompt is done: nothing more to write
                del self._tracked[req_id]
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)  # its last step's rows are written: nothing more
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    # ---- worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.config import get_layers_from_vllm_config
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        layers = list(get_layers_from_vllm_config(self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches)))
        if len(layers) != 1:
            raise ValueError(f"expected one CacheOnlyAttentionLayer in the model, found {len(layers)}")
        self._cache = kv_caches[layers[0]]
        self._writes = get_tensor_model_parallel_rank() == 0

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        pass  # the rows are read after the whole forward (wait_for_save)

    def wait_for_save(self) -> None:
        if not self._writes or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, _Meta) or not meta.saves:
            return
        cache = self._cache
        assert cache is not None
        size = cache.shape[2]
        # every request's rows of this step in one gather and one copy to the host (one device sync per step)
        slots = [torch.arange(save.start, save.end) for save in meta.saves]
        blocks = torch.cat(
            [torch.tensor(save.block_ids, dtype=torch.long)[s // size] for save, s in zip(meta.saves, slots)]
        )
        offsets = torch.cat(slots) % size
        rows = cache[blocks.to(cache.device), 0, offsets.to(cache.device)].to("cpu", torch.float32).numpy()
        hidden, done = rows.shape[1], 0
        for save in meta.saves:
            part, done = rows[done : done + save.end - save.start], done + save.end - save.start
            try:  # only a request's first rows create its file: a later step finding none means the caller is gone
                fd = os.open(save.path, os.O_WRONLY | (os.O_CREAT if save.start == 0 else 0), 0o600)
            except FileNotFoundError:  # (an aborted request whose file the stage removed)
                continue
            try:
                if save.start == 0:
                    os.pwrite(fd, struct.pack(HEADER, hidden), 0)
                os.pwrite(fd, part.tobytes(), struct.calcsize(HEADER) + save.start * hidden * 4)
            finally:
                os.close(fd)
