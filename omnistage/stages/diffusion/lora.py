"""Per-request LoRA adapters inside one batched denoiser forward.

Requests with different adapters, different scales and none share one forward: the base layers run
once over all rows, and each targeted ``nn.Linear`` adds ``scale_r * scaling * up_a(down_a(x_r))``
to the rows ``r`` whose request uses adapter ``a``. Weights are never merged and the batch is never
split per adapter.

- ``LoraSet`` holds up to ``max_loras`` adapters in slots: per targeted layer one stacked
  ``down`` [slots + 1, max_rank, in] and ``up`` [slots + 1, out, max_rank] (rank zero-padded; the
  last slot is all zeros and stands for "no adapter"). A PyTorch forward hook on the layer adds the
  delta with a gathered matmul: each row's slot selects its weights (``index_select``), then two
  ``bmm`` over all rows. One kernel sequence per layer whatever the mix of adapters; rows without an
  adapter get an exact zero added (their values stay what the base layer gave).
- The runner tells the hooks whose rows a forward has (``forward_rows``): the slot and scale of
  each request's rows, cond and uncond alike (diffusers applies the LoRA to both passes). Forwards
  where no request uses an adapter set nothing: the hooks then leave every output untouched, so
  such a request is bit-identical to a stage without LoRA.
- Code that runs the denoiser (or some of its blocks) on a subset of the forward's rows says so
  with ``narrow_rows(idx)``: the step cache's computing rows, Wan2.2's per-expert rows.
- Unloading an adapter that running requests use frees its slot only when the last of them has
  released it (``LoraUse.release``); new requests no longer find its name.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.lora_files import LayerLora, LoraFile, read_lora_file

if TYPE_CHECKING:
    from omnistage.stages.diffusion.adapter import DiffusionJob

logger = logging.getLogger(__name__)

DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_LORA_RANK = 16  # vLLM's default


# ------------------------------------------------------------------ the rows of one forward


@dataclass(frozen=True)
class RowLora:
    """Per row of the tensors a denoiser call sees: its adapter slot and its request's ``lora_scale``."""

    slots: torch.Tensor  # long [rows]; the zero slot for rows without an adapter
    scales: torch.Tensor  # float32 [rows]; 0 for rows without an adapter

    @property
    def rows(self) -> int:
        return self.slots.shape[0]

    def take(self, idx: torch.Tensor) -> RowLora:
        idx = idx.to(self.slots.device)
        return RowLora(self.slots.index_select(0, idx), self.scales.index_select(0, idx))


_ROWS: ContextVar[RowLora | None] = ContextVar("omnistage_lora_rows", default=None)


@contextlib.contextmanager
def narrow_rows(idx: torch.Tensor) -> Iterator[None]:
    """Code inside runs on rows ``idx`` of the current forward (a no-op when no request uses an adapter)."""
    rows = _ROWS.get()
    if rows is None:
        yield
        return
    token = _ROWS.set(rows.take(idx))
    try:
        yield
    finally:
        _ROWS.reset(token)


@dataclass
class LoraUse:
    """One request's adapter: set on its job at admission, released when the job leaves the engine."""

    name: str
    slot: int
    scale: float
    owner: LoraSet
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.owner._release(self)


class _RowCache:
    """The last few row assignments: a batch keeps its composition for many steps, so the small index
    tensors are built (and copied to the device) once, not per step."""

    def __init__(self, size: int = 8):
        self.size = size
        self.items: dict[tuple, RowLora] = {}

    def get(self, key: tuple, build: Any) -> RowLora:
        rows = self.items.pop(key, None)
        if rows is None:
            rows = build()
            if len(self.items) >= self.size:
                self.items.pop(next(iter(self.items)))
        self.items[key] = rows
        return rows


@contextlib.contextmanager
def forward_rows(segments: Sequence[tuple[DiffusionJob, str]]) -> Iterator[None]:
    """The rows of the denoiser call(s) inside: ``(job, "cond" | "uncond")`` per ``job.rows`` rows, in row
    order. Sets nothing when no job uses an adapter."""
    uses = [(job.lora, job.rows) for job, _ in segments]
    owner = next((u.owner for u, _ in uses if u is not None), None)
    if owner is None:
        yield
        return
    key = tuple((u.slot, u.scale, n) if u is not None else (None, 0.0, n) for u, n in uses)
    token = _ROWS.set(owner.rows_for(key))
    try:
        yield
    finally:
        _ROWS.reset(token)


# ------------------------------------------------------------------ one targeted layer


class _LayerSlots:
    """The stacked weights of every slot for one ``nn.Linear``, and the hook that applies them."""

    def __init__(self, layer: nn.Linear, slots: int, max_rank: int, device: torch.device):
        dtype = layer.weight.dtype
        self.layer = layer
        # on the device the forward runs on (with CPU offload the layer's weights may be elsewhere now)
        self.down = torch.zeros(slots + 1, max_rank, layer.in_features, dtype=dtype, device=device)
        self.up = torch.zeros(slots + 1, layer.out_features, max_rank, dtype=dtype, device=device)
        self.scaling = torch.zeros(slots + 1, dtype=torch.float32, device=device)
        self.used: set[int] = set()
        self.handle = layer.register_forward_hook(self._hook)

    def put(self, slot: int, weights: LayerLora) -> None:
        r = weights.rank
        self.down[slot].zero_()
        self.up[slot].zero_()
        self.down[slot, :r].copy_(weights.down)
        self.up[slot, :, :r].copy_(weights.up)
        self.scaling[slot] = weights.scaling
        self.used.add(slot)

    def clear(self, slot: int) -> None:
        self.down[slot].zero_()
        self.up[slot].zero_()
        self.scaling[slot] = 0.0
        self.used.discard(slot)

    def _hook(self, module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor | None:
        rows = _ROWS.get()
        if rows is None:
            return None
        x = args[0]
        if x.shape[0] != rows.rows:
            raise RuntimeError(
                f"LoRA: a layer ran {x.shape[0]} rows, the engine laid out {rows.rows} "
                "(code running a subset of rows must say so with lora.narrow_rows)"
            )
        n, d_in = x.shape[0], x.shape[-1]
        down = self.down.index_select(0, rows.slots)  # [n, R, in]
        up = self.up.index_select(0, rows.slots)  # [n, out, R]
        h = torch.bmm(x.reshape(n, -1, d_in).to(down.dtype), down.transpose(1, 2))
        delta = torch.bmm(h, up.transpose(1, 2))
        coef = rows.scales * self.scaling.index_select(0, rows.slots)  # float32, as PEFT's Python-float scaling
        # PEFT's order: result + up(down(x)) * scaling, the product rounded once to the layer's dtype
        return out + (delta * coef.view(n, 1, 1)).to(out.dtype).reshape(out.shape)

    def remove(self) -> None:
        self.handle.remove()


# ------------------------------------------------------------------ the adapters of one stage replica


@dataclass
class _Adapter:
    name: str
    slot: int
    path: str
    rank: int
    users: int = 0
    unloading: bool = False
    layers: list[tuple[str, str]] = field(default_factory=list)


class LoraSet:
    """The LoRA adapters one diffusion stage replica holds, applied per row of its denoiser forwards."""

    def __init__(
        self, pipe: Any, device: torch.device, max_loras: int = DEFAULT_MAX_LORAS, max_rank: int = DEFAULT_MAX_LORA_RANK
    ):
        self.pipe = pipe
        self.device = device
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._adapters: dict[str, _Adapter] = {}  # loaded (and still selectable)
        self._draining: list[_Adapter] = []  # unloaded, still used by running requests
        self._layers: dict[tuple[str, str], _LayerSlots] = {}
        self._rows = _RowCache()
        self._lock = threading.Lock()  # loads run in a worker thread, releases on the event loop

    @property
    def names(self) -> list[str]:
        return list(self._adapters)

    def path(self, name: str) -> str:
        return self._adapters[name].path

    def read(self, path: str, field: str = "lora_path") -> LoraFile:
        """Parse and check a file without loading it (the slow part, safe to run beside forwards)."""
        return read_lora_file(self.pipe, path, self.max_rank, field)

    def load(self, name: str, lora: LoraFile, field: str = "lora_name") -> None:
        """Put a parsed adapter in a free slot. Call between forwards (the engine holds its step lock)."""
        with self._lock:
            if name in self._adapters:
                raise InvalidRequestError(field, f"a LoRA adapter named {name!r} is already loaded")
            slot = self._free_slot(field)
            adapter = _Adapter(name, slot, lora.path, lora.rank)
            try:
                for key, weights in lora.layers.items():
                    layer = self._layers.get(key)
                    if layer is None:
                        layer = self._layers[key] = _LayerSlots(
                            self._module(key), self.max_loras, self.max_rank, self.device
                        )
                    layer.put(slot, weights)
                    adapter.layers.append(key)
            except BaseException:
                self._clear(adapter)
                raise
            self._adapters[name] = adapter
            self._rows.items.clear()
        logger.info(
            "LoRA %r loaded from %s (rank %d, %d layers, slot %d)", name, lora.path, lora.rank, len(lora.layers), slot
        )

    def unload(self, name: str, field: str = "lora_name") -> None:
        """The name stops resolving now; the slot is freed once no running request uses it. Call between
        forwards."""
        with self._lock:
            adapter = self._adapters.pop(name, None)
            if adapter is None:
                raise InvalidRequestError(field, f"no LoRA adapter named {name!r} is loaded")
            adapter.unloading = True
            if adapter.users:
                self._draining.append(adapter)
                return
            self._clear(adapter)

    def use(self, name: str, scale: float, field: str = "model") -> LoraUse:
        with self._lock:
            adapter = self._adapters.get(name)
            if adapter is None:
                raise InvalidRequestError(field, f"the LoRA adapter {name!r} is not loaded")
            adapter.users += 1
            return LoraUse(name, adapter.slot, float(scale), self)

    def users(self, name: str) -> int:
        adapter = self._adapters.get(name) or next((a for a in self._draining if a.name == name), None)
        return adapter.users if adapter is not None else 0

    def close(self) -> None:
        for layer in self._layers.values():
            layer.remove()
        self._layers.clear()
        self._adapters.clear()
        self._draining.clear()

    # -------------------------------------------------------------- internals

    def rows_for(self, key: tuple) -> RowLora:
        def build() -> RowLora:
            zero = self.max_loras  # the all-zero slot
            slots = [zero if slot is None else slot for slot, _, n in key for _ in range(n)]
            scales = [scale for _, scale, n in key for _ in range(n)]
            return RowLora(
                torch.tensor(slots, dtype=torch.long, device=self.device),
                torch.tensor(scales, dtype=torch.float32, device=self.device),
            )

        return self._rows.get(key, build)

    def _release(self, use: LoraUse) -> None:
        with self._lock:
            adapter = self._adapters.get(use.name)
            if adapter is None or adapter.slot != use.slot:
                adapter = next((a for a in self._draining if a.slot == use.slot and a.name == use.name), None)
            if adapter is None:
                return
            adapter.users -= 1
            # freed by ``collect`` at the next step boundary: a forward may still be reading the slot now

    def collect(self) -> None:
        """Free the slots of unloaded adapters no request uses any more. Call between forwards."""
        with self._lock:
            for adapter in [a for a in self._draining if a.users <= 0]:
                self._draining.remove(adapter)
                self._clear(adapter)

    def _free_slot(self, field: str) -> int:
        taken = {a.slot for a in self._adapters.values()} | {a.slot for a in self._draining}
        free = [s for s in range(self.max_loras) if s not in taken]
        if not free:
            draining = f" ({len(self._draining)} unloaded, still finishing requests)" if self._draining else ""
            raise InvalidRequestError(
                field, f"max_loras={self.max_loras} adapters are loaded{draining}; unload one first"
            )
        return free[0]

    def _clear(self, adapter: _Adapter) -> None:
        for key in adapter.layers:
            layer = self._layers.get(key)
            if layer is None:
                continue
            layer.clear(adapter.slot)
            if not layer.used:  # no adapter targets this layer any more: drop its hook and weights
                layer.remove()
                del self._layers[key]
        adapter.layers.clear()
        self._rows.items.clear()

    def _module(self, key: tuple[str, str]) -> nn.Linear:
        component, module = key
        return getattr(self.pipe, component).get_submodule(module)
