"""msgpack (msgspec) encoding for control messages between processes.

Tensors, arrays and images travel as typed raw bytes (msgpack ext types) so
nothing is pickled on the wire and dtypes (bfloat16 included) survive.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import numpy as np
import torch
from PIL import Image

_NDARRAY, _TENSOR, _IMAGE = 1, 2, 3


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return _ext(_TENSOR, [str(t.dtype).removeprefix("torch."), list(t.shape)], raw)
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return _ext(_NDARRAY, [arr.dtype.str, list(arr.shape)], arr.tobytes())
    if isinstance(obj, Image.Image):
        arr = np.asarray(obj)
        return _ext(_IMAGE, [obj.mode, list(arr.shape)], arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):  # pydantic params; a torch.Generator cannot cross processes
        return {k: v for k, v in obj.model_dump().items() if k != "generator"}
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot send a {type(obj).__name__} between stage processes")


def _ext(code: int, header: list, raw: bytes) -> msgspec.msgpack.Ext:
    """Ext payload: 4-byte header length, msgpack header (dtype, shape), raw bytes."""
    head = msgspec.msgpack.encode(header)
    return msgspec.msgpack.Ext(code, len(head).to_bytes(4, "little") + head + raw)


def _split(data: memoryview) -> tuple[list, memoryview]:
    n = int.from_bytes(data[:4], "little")
    return msgspec.msgpack.decode(data[4 : 4 + n]), data[4 + n :]


def _ext_hook(code: int, data: memoryview) -> Any:
    header, raw = _split(data)
    if code == _TENSOR:
        dtype_name, shape = header
        dtype = getattr(torch, dtype_name)
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
    if code == _NDARRAY:
        dtype, shape = header
        return np.frombuffer(bytes(raw), dtype=np.dtype(dtype)).reshape(shape).copy()
    if code == _IMAGE:
        mode, shape = header
        return Image.fromarray(np.frombuffer(bytes(raw), dtype=np.uint8).reshape(shape), mode=mode)
    raise msgspec.DecodeError(f"unknown ext type {code}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


def encode(msg: Any) -> bytes:
    return _encoder.encode(msg)


def decode(buf: bytes) -> Any:
    return _decoder.decode(buf)
