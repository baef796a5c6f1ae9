"""msgpack (msgspec) encoding for messages between stage processes (messages.py).

Tensors, arrays and images travel as typed raw bytes (msgpack ext types), so
nothing is pickled on the wire and dtypes (bfloat16 included) survive. Buffers
of at least ``shm_threshold`` bytes go through a shared-memory segment instead
of the socket: the sender writes and closes it, the receiver copies it out and
unlinks it (both processes share one multiprocessing resource tracker, so a
segment whose message is never read is still cleaned up at exit).
"""

from __future__ import annotations

from multiprocessing import shared_memory
from typing import Any

import msgspec
import numpy as np
import torch
from PIL import Image
from pydantic import BaseModel

_NDARRAY, _TENSOR, _IMAGE = 1, 2, 3
_SHM = 16  # added to the payload type when the bytes live in shared memory

DEFAULT_SHM_THRESHOLD = 1 << 20


def _ext(code: int, header: list, raw: bytes | memoryview) -> msgspec.msgpack.Ext:
    """Ext payload: 4-byte header length, msgpack header, raw bytes."""
    head = msgspec.msgpack.encode(header)
    return msgspec.msgpack.Ext(code, len(head).to_bytes(4, "little") + head + bytes(raw))


def _split(data: memoryview) -> tuple[list, memoryview]:
    n = int.from_bytes(data[:4], "little")
    return msgspec.msgpack.decode(data[4 : 4 + n]), data[4 + n :]


class Codec:
    """Encodes any message; decodes into ``decode_type`` (a tagged union of message Structs)."""

    def __init__(self, decode_type: Any = Any, shm_threshold: int | None = None):
        self.shm_threshold = shm_threshold
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._decoder = msgspec.msgpack.Decoder(decode_type, ext_hook=self._ext_hook)

    def encode(self, msg: Any) -> bytes:
        return self._encoder.encode(msg)

    def decode(self, buf: bytes) -> Any:
        return self._decoder.decode(buf)

    # ------------------------------------------------------------------ hooks

    def _buffer(self, code: int, header: list, raw: memoryview) -> msgspec.msgpack.Ext:
        if self.shm_threshold is None or raw.nbytes < self.shm_threshold:
            return _ext(code, header, raw)
        shm = shared_memory.SharedMemory(create=True, size=raw.nbytes)
        try:
            shm.buf[: raw.nbytes] = raw.cast("B")
        finally:
            shm.close()
        return _ext(code + _SHM, header + [shm.name, raw.nbytes], b"")

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous()
            raw = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
            return self._buffer(_TENSOR, [str(t.dtype).removeprefix("torch."), list(t.shape)], raw)
        if isinstance(obj, np.ndarray):
            arr = np.ascontiguousarray(obj)
            return self._buffer(_NDARRAY, [arr.dtype.str, list(arr.shape)], memoryview(arr.reshape(-1).view(np.uint8)))
        if isinstance(obj, Image.Image):
            if obj.mode not in ("L", "RGB", "RGBA"):  # palette etc.: send the pixels, not the indices
                obj = obj.convert("RGB")
            arr = np.ascontiguousarray(np.asarray(obj))
            return self._buffer(_IMAGE, [obj.mode, list(arr.shape)], memoryview(arr.reshape(-1).view(np.uint8)))
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, BaseModel):  # typed params; a torch.Generator cannot cross processes
            return {k: v for k, v in obj.model_dump().items() if k != "generator"}
        raise TypeError(f"cannot send a {type(obj).__name__} between stage processes")

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        header, raw = _split(data)
        if code >= _SHM:
            code -= _SHM
            *header, name, nbytes = header
            shm = shared_memory.SharedMemory(name=name)
            try:
                raw = bytes(shm.buf[:nbytes])
            finally:
                shm.close()
                shm.unlink()
        if code == _TENSOR:
            dtype_name, shape = header
            dtype = getattr(torch, dtype_name)
            if not len(raw):
                return torch.empty(shape, dtype=dtype)
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
        if code == _NDARRAY:
            dtype, shape = header
            return np.frombuffer(bytes(raw), dtype=np.dtype(dtype)).reshape(shape).copy()
        if code == _IMAGE:
            _mode, shape = header  # L / RGB / RGBA: inferred from the shape
            return Image.fromarray(np.frombuffer(bytes(raw), dtype=np.uint8).reshape(shape))
        raise msgspec.DecodeError(f"unknown ext type {code}")
