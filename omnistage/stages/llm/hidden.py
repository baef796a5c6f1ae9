"""Per-token hidden states out of a generating vLLM engine: the names its way out uses, and the reader.

vLLM's public API returns no hidden states from a generating engine. The Qwen-Omni thinkers hand out their own
(``hidden_connector.py``): the model writes the wanted hidden state of every token it computes into a cache-only
layer named ``LAYER.<n>``, and a KV connector (``CONNECTOR``: the engine's ``kv_transfer_config``) copies the rows of
a request that sets ``PATH_KEY`` in ``SamplingParams.extra_args["kv_transfer_params"]`` into that file each step —
the prompt's rows, and with ``REPLY_KEY`` true also the reply's tokens fed back. No second engine, no second
prefill. This module imports no vLLM (the stage reads the files, the engine core writes them).
"""

from __future__ import annotations

import struct
from typing import Any

PATH_KEY = "omnistage_hidden_path"
REPLY_KEY = "omnistage_hidden_reply"
LAYER = "omnistage_hidden"
CONNECTOR = {
    "kv_connector": "HiddenRowsConnector",
    "kv_connector_module_path": "omnistage.stages.llm.hidden_connector",
    "kv_role": "kv_producer",
}
HEADER = "<q"  # the file starts with the hidden size; float32 rows follow


def read_rows(path: str, stop: int, start: int = 0) -> Any:
    """Rows ``[start, stop)`` of a connector's file, a [stop - start, hidden] float32 tensor. Raises RuntimeError when
    the file is missing or holds fewer (the engine computed fewer tokens than the caller counts)."""
    import numpy as np
    import torch

    skip = struct.calcsize(HEADER)
    try:
        with open(path, "rb") as f:
            head = f.read(skip)
            (hidden,) = struct.unpack(HEADER, head) if len(head) == skip else (0,)
            f.seek(skip + start * hidden * 4)
            data = f.read((stop - start) * hidden * 4)
    except FileNotFoundError:
        raise RuntimeError(f"the engine wrote no hidden states to {path}") from None
    if hidden <= 0 or len(data) < (stop - start) * hidden * 4:
        have = start + len(data) // (4 * hidden) if hidden > 0 else 0
        raise RuntimeError(f"the engine wrote the hidden states of {have} tokens to {path}, not {stop}")
    return torch.from_numpy(np.frombuffer(data, np.float32).reshape(stop - start, hidden).copy())
