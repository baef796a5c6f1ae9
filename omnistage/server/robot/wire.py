"""OpenPI's frame encoding: msgpack, with a NumPy array as a map ``{__ndarray__: true, data, dtype, shape}``
(``data`` the raw bytes in C order, ``dtype`` NumPy's type string such as ``"<f4"``) and a NumPy scalar as
``{__npgeneric__: true, data, dtype}``; the keys are bytes. This is the documented shape of what
``openpi_client.msgpack_numpy`` writes and reads, so its ``WebsocketClientPolicy`` talks to us unchanged.
Object, void and complex arrays are refused: they would need pickle."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

_ARRAY, _SCALAR = b"__ndarray__", b"__npgeneric__"


class WireError(ValueError):
    """A frame that is not OpenPI's msgpack (the message says what was wrong)."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in "OVc":
        raise TypeError(f"cannot send a {obj.dtype} array")
    if isinstance(obj, np.ndarray):
        data = np.ascontiguousarray(obj)
        return {_ARRAY: True, b"data": data.tobytes(), b"dtype": data.dtype.str, b"shape": list(data.shape)}
    if isinstance(obj, np.generic):
        return {_SCALAR: True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def _decode(obj: dict) -> Any:
    if _ARRAY in obj:
        dtype = np.dtype(obj[b"dtype"])
        if dtype.kind in "OVc":
            raise WireError(f"an array of dtype {dtype} (object, void and complex arrays are not taken)")
        shape = tuple(int(n) for n in obj[b"shape"])
        data = obj[b"data"]
        if len(data) != dtype.itemsize * int(np.prod(shape)):
            raise WireError(f"an array's data holds {len(data)} bytes, not {shape} x {dtype}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if _SCALAR in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_encode)


def unpack(frame: bytes) -> Any:
    try:
        return msgpack.unpackb(frame, object_hook=_decode, strict_map_key=False)
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise WireError(f"not an OpenPI msgpack frame ({type(e).__name__}: {e})") from None
