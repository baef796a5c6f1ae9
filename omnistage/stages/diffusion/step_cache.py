"""Per-request step caching inside step-level batches (first-block cache and TeaCache rules).

A residual-reuse cache: at each step a cheap probe is compared with the request's own probe of an
earlier step; a request whose probe changed little reuses the residual its transformer blocks added
the last time they ran, and skips those blocks. Rows of one batch decide for themselves: in one
forward some rows run the blocks while the others add their cached residual.

How it runs inside diffusers' own ``forward`` (nothing of the model's code is copied): every block a
family declares (blocks.py) gets a diffusers ``ModelHook``.

- The first block decides. ``first_block``: it runs for every row; the probe is its residual (output
  minus input), as in ParaAttention's first-block cache. ``teacache``: the probe is the first block's
  timestep-modulated input (the family's ``probe``), and the first block is cached too.
- From there on, the blocks run only on the rows that compute: the tensors passed from block to
  block shrink to those rows and the per-row arguments (``temb``, ...) are cut to match.
- The last block writes the full batch back: computing rows get their block output (and store the
  new residual of the image tokens), the others ``anchor + cached residual`` (their text stream, which
  the output heads do not read, leaves as it entered the cached blocks).

Decisions are per request and per step, on its cond rows; its uncond rows follow (with separate
CFG passes the cond pass, which runs first, decides). A request's state lives on its job
(``job.step_cache``); requests with ``cache: false`` always compute. Without an active forward (e.g.
GLM-Image's source-image pass) the hooks only run the block.

The rules and the per-request state they update: cache_rules.py.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import deque
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.cache_rules import CacheRule, JobCache, ModelState
from omnistage.stages.diffusion.lora import narrow_rows

COND, UNCOND = "cond", "uncond"
HOOK_NAME = "omnistage_step_cache"


# ------------------------------------------------------------------ the rows of one forward


@dataclass
class Group:
    job: DiffusionJob
    kind: str  # COND | UNCOND
    idx: list[int]  # the group's row positions in this forward


@dataclass
class Forward:
    groups: list[Group]
    n_rows: int

    @classmethod
    def of(cls, segments: Sequence[tuple[DiffusionJob, str]]) -> Forward:
        groups, pos = [], 0
        for job, kind in segments:
            groups.append(Group(job, kind, list(range(pos, pos + job.rows))))
            pos += job.rows
        return cls(groups, pos)

    def subset(self, idx: Sequence[int]) -> Forward:
        where = {r: i for i, r in enumerate(idx)}
        groups = []
        for g in self.groups:
            kept = [where[r] for r in g.idx if r in where]
            if kept:
                if len(kept) != len(g.idx):
                    raise ValueError("step cache: a sub-forward splits one request's rows")
                groups.append(Group(g.job, g.kind, kept))
        return Forward(groups, len(idx))


_ACTIVE: ContextVar[Forward | None] = ContextVar("omnistage_step_cache_forward", default=None)


@contextlib.contextmanager
def row_subset(idx: torch.Tensor) -> Iterator[None]:
    """Wrap a denoiser call on a subset of the forward's rows (Wan2.2 sends rows to two experts), so the
    step cache and the LoRA layers know whose rows they are. A no-op when neither is active."""
    with narrow_rows(idx):
        fwd = _ACTIVE.get()
        if fwd is None:
            yield
            return
        token = _ACTIVE.set(fwd.subset(idx.tolist()))
        try:
            yield
        finally:
            _ACTIVE.reset(token)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


@dataclass
class _Scratch:
    """One model call's decisions, from its first block to its last."""

    fwd: Forward
    compute: list[Group]
    skip: list[Group]
    idx_c: torch.Tensor  # computing rows, in forward order (the compact batch)
    idx_s: torch.Tensor  # skipping rows, in the order of ``skip``'s groups
    anchor: dict[str, torch.Tensor | None] = field(default_factory=dict)
    sliced: dict[int, Any] = field(default_factory=dict)  # id(per-row argument) -> its computing rows

    @property
    def all(self) -> bool:
        return not self.skip

    @property
    def none(self) -> bool:
        return not self.compute


# ------------------------------------------------------------------ hooks


def _hook_base() -> type:
    from diffusers.hooks import ModelHook

    return ModelHook


class _Chain:
    """The hooks of one denoiser's blocks and the state of its current call."""

    def __init__(self, index: int, layout: BlockLayout, rule: CacheRule | None, log: deque):
        self.index = index
        self.log = log
        self.layout = layout
        self.rule = rule
        self.scratch: _Scratch | None = None
        if rule is not None:
            if rule.probe_before_first_block and layout.probe is None:
                raise ValueError(
                    f"{type(layout.model).__name__}: teacache needs the family's probe "
                    "(BlockLayout.probe); use method: first_block"
                )
            if not rule.probe_before_first_block and len(layout.blocks) < 2:
                raise ValueError(
                    f"{type(layout.model).__name__} has {len(layout.blocks)} transformer block(s); "
                    "first_block caching needs at least 2"
                )
            first = layout.blocks[0][1].names if layout.blocks else ()
            for _, io in layout.blocks:
                if io.hidden not in io.names or any(n not in first for n in io.joins):
                    raise ValueError(
                        f"a block layout of {type(layout.model).__name__} returns no {io.hidden!r} "
                        f"or joins streams its first block does not return"
                    )

    # -------------------------------------------------------------- one block call

    def call(self, hook: Any, args: tuple, kwargs: dict) -> Any:
        fwd = _ACTIVE.get()
        if self.rule is None or fwd is None:
            return hook.run(*args, **kwargs)
        bound = hook.signature.bind(*args, **kwargs)
        a = bound.arguments
        if hook.first:
            rows = a[hook.io.hidden].shape[0]
            if rows != fwd.n_rows:
                raise ValueError(
                    f"step cache: the denoiser ran {rows} rows, the engine laid out "
                    f"{fwd.n_rows} (a sub-batch needs step_cache.row_subset)"
                )
            out = self._first(fwd, hook, bound)
        else:
            out = self._rows(hook, bound, carried_full=False)
        if hook.last:
            out = self._last(hook.io, out)
        return out

    def _first(self, fwd: Forward, hook: Any, bound: inspect.BoundArguments) -> Any:
        a, io = bound.arguments, hook.io
        if self.rule.probe_before_first_block:
            self.scratch = self._decide(fwd, self.layout.probe(hook.block, a))
            self.scratch.anchor = {n: a.get(n) for n in io.names}
            return self._rows(hook, bound, carried_full=True)
        out = hook.run(*bound.args, **bound.kwargs)
        o = io.unpack(out)
        self.scratch = sc = self._decide(fwd, o[io.hidden] - a[io.hidden])
        sc.anchor = o
        if sc.all or sc.none:
            return out
        return io.pack({n: None if v is None else v.index_select(0, sc.idx_c) for n, v in o.items()})

    def _rows(self, hook: Any, bound: inspect.BoundArguments, carried_full: bool) -> Any:
        """Run the block on the computing rows (its carried inputs already hold just those rows unless
        ``carried_full``); with none, pass the carried inputs through."""
        sc, io, a = self.scratch, hook.io, bound.arguments
        if sc.all:
            return hook.run(*bound.args, **bound.kwargs)
        if sc.none:
            return io.pack({n: a.get(n) for n in io.names})
        for name in io.per_row:
            if name in a and a[name] is not None:
                key = id(a[name])
                if key not in sc.sliced:
                    sc.sliced[key] = io.take_rows(name, a[name], sc.idx_c)
                a[name] = sc.sliced[key]
        if carried_full:
            for name in io.names:
                if a.get(name) is not None:
                    a[name] = a[name].index_select(0, sc.idx_c)
        with narrow_rows(sc.idx_c):  # the rows keep their LoRA adapters
            return hook.run(*bound.args, **bound.kwargs)

    def _last(self, io: BlockIO, out: Any) -> Any:
        """Only the image-token stream's residual is cached: the other streams (the text tokens of joint
        blocks) of reused rows leave the chain as they entered its cached part. The families' output heads
        read the image tokens alone, and a text stream's length may change with the batch (padded text)."""
        sc, self.scratch = self.scratch, None
        o = io.unpack(out)
        if sc.all:
            residual = io.image_tokens(o[io.hidden] - io.anchor(sc.anchor, io.hidden), sc.anchor)
            self._store(sc.compute, residual, compact=None)
            return out
        result = {}
        for name in io.names:
            anchor = io.anchor(sc.anchor, name)
            computed = None if sc.none else o[name]
            if anchor is None or (not sc.none and computed is None):
                result[name] = None  # e.g. SD3's last block drops the text stream
                continue
            reused = anchor.index_select(0, sc.idx_s)
            if name == io.hidden:
                cached = [self._state(g.job).residual[g.kind] for g in sc.skip]
                reused = io.add_image_residual(reused, cached[0] if len(cached) == 1 else torch.cat(cached))
            full = reused.new_empty((sc.fwd.n_rows, *reused.shape[1:]))
            full.index_copy_(0, sc.idx_s, reused)
            if not sc.none:
                if name == io.hidden:
                    residual = io.image_tokens(computed - anchor.index_select(0, sc.idx_c), sc.anchor)
                    self._store(sc.compute, residual, compact=sc.idx_c)
                full.index_copy_(0, sc.idx_c, computed)
            result[name] = full
        return io.pack(result)

    # -------------------------------------------------------------- decisions and state

    def _state(self, job: DiffusionJob) -> ModelState:
        return job.step_cache.models.setdefault(self.index, ModelState())

    def _store(self, groups: list[Group], residual: torch.Tensor, compact: torch.Tensor | None) -> None:
        """Keep each computing group's rows of the new residual (rows in forward order, or in the order of
        the compact batch ``compact`` lists)."""
        position = None if compact is None else {r: i for i, r in enumerate(compact.tolist())}
        for g in groups:
            if g.job.step_cache is None:
                continue
            rows = g.idx if position is None else [position[r] for r in g.idx]
            self._state(g.job).residual[g.kind] = residual.index_select(0, _index(rows, residual.device))

    def _decide(self, fwd: Forward, probe: torch.Tensor) -> _Scratch:
        pending: list[tuple[DiffusionJob, ModelState, torch.Tensor]] = []
        for g in fwd.groups:
            jc = g.job.step_cache
            if jc is None or jc.step == g.job.step or g.kind != COND:
                continue
            p = probe.index_select(0, _index(g.idx, probe.device))
            pending.append((g.job, self._state(g.job), p))
        undecided = {
            id(g.job) for g in fwd.groups if g.job.step_cache is not None and g.job.step_cache.step != g.job.step
        }
        if len(undecided) != len(pending):
            raise ValueError("step cache: a request's uncond rows ran before its cond rows in a step")
        with_prev = [(st, p) for _, st, p in pending if st.prev is not None]
        rels: list[float] = []
        if with_prev:
            nums = torch.stack([(p - st.prev).abs().mean() for st, p in with_prev])
            dens = torch.stack([st.prev.abs().mean() for st, _ in with_prev])
            rels = (nums / dens).tolist()  # one device sync for the whole batch
        rel_iter = iter(rels)
        for job, st, p in pending:
            rel = next(rel_iter) if st.prev is not None else None
            compute = self.rule.decide(st, job, rel)
            needed = (COND, UNCOND) if job.do_cfg else (COND,)
            if not compute and any(k not in st.residual for k in needed):
                compute, st.acc = True, 0.0
            if self.rule.keeps_probe(compute):
                st.prev = p
            jc = job.step_cache
            jc.step, jc.compute = job.step, compute
            if compute:
                jc.computed += 1
                st.streak = 0
            else:
                jc.reused += 1
                st.streak += 1
        compute_groups = [g for g in fwd.groups if g.job.step_cache is None or g.job.step_cache.compute]
        skip_groups = [g for g in fwd.groups if g.job.step_cache is not None and not g.job.step_cache.compute]
        self.log.append(
            (
                list(dict.fromkeys(g.job.request_id for g in compute_groups)),
                list(dict.fromkeys(g.job.request_id for g in skip_groups)),
            )
        )
        device = probe.device
        idx_c = _index(sorted(r for g in compute_groups for r in g.idx), device)
        idx_s = _index([r for g in skip_groups for r in g.idx], device)
        return _Scratch(fwd, compute_groups, skip_groups, idx_c, idx_s)


class StepHooks:
    """Hooks on every declared block: step caching with ``rule``, and/or each block's forward compiled
    (``compile_fn``: e.g. ``torch.compile`` with dynamic shapes). ``close`` removes them."""

    def __init__(self, layouts: Sequence[BlockLayout], rule: CacheRule | None, compile_fn: Any = None):
        from diffusers.hooks import HookRegistry

        base = _hook_base()

        class BlockHook(base):  # a subclass made here: importing diffusers costs seconds at module import
            def __init__(self, chain: _Chain, block: nn.Module, io: BlockIO, first: bool, last: bool):
                super().__init__()
                self.chain, self.block, self.io, self.first, self.last = chain, block, io, first, last
                self.signature = inspect.signature(block.forward)
                self.run: Any = None

            def new_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
                if self.run is None:
                    original = self.fn_ref.original_forward
                    self.run = compile_fn(original) if compile_fn is not None else original
                return self.chain.call(self, args, kwargs)

        self.rule = rule
        # (computing, reusing) request ids of the most recent model calls: observable for tests and debugging
        self.log: deque[tuple[list[str], list[str]]] = deque(maxlen=4096)
        self.chains = [_Chain(i, layout, rule, self.log) for i, layout in enumerate(layouts)]
        self._blocks: list[nn.Module] = []
        for chain in self.chains:
            n = len(chain.layout.blocks)
            for pos, (block, io) in enumerate(chain.layout.blocks):
                registry = HookRegistry.check_if_exists_or_initialize(block)
                registry.register_hook(BlockHook(chain, block, io, pos == 0, pos == n - 1), HOOK_NAME)
                self._blocks.append(block)

    def admit(self, job: DiffusionJob) -> None:
        """Give a new request its cache state (none when it opted out with ``cache: false``)."""
        job.step_cache = JobCache() if self.rule is not None and job.params.cache else None

    @contextlib.contextmanager
    def forward(self, segments: Sequence[tuple[DiffusionJob, str]]) -> Iterator[None]:
        """The rows of the denoiser call(s) inside: ``(job, COND | UNCOND)`` per group of ``job.rows`` rows."""
        token = _ACTIVE.set(Forward.of(segments) if self.rule is not None else None)
        try:
            yield
        finally:
            _ACTIVE.reset(token)
            for chain in self.chains:
                chain.scratch = None

    def close(self) -> None:
        from diffusers.hooks import HookRegistry

        for block in self._blocks:
            HookRegistry.check_if_exists_or_initialize(block).remove_hook(HOOK_NAME, recurse=False)
        self._blocks.clear()
