"""The LoRA adapters an llm stage serves: vLLM's own LoRA support, one ``LoRARequest`` per adapter name
(from ``lora_modules`` at start-up or loaded at run time), resolved per request from its ``lora`` key."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams


class VllmLoras:
    def __init__(self, stage_id: int, enabled: bool):
        self.stage_id = stage_id
        self.enabled = enabled
        self._loras: dict[str, Any] = {}  # adapter name -> vllm LoRARequest
        self._ids = itertools.count(1)

    def names(self) -> list[str]:
        return list(self._loras)

    async def load(self, engine: Any, name: str, path: str) -> None:
        """vLLM's ``add_lora`` (checks and preloads the adapter); errors name ``lora_path`` / ``lora_name``."""
        from vllm.lora.request import LoRARequest

        if not self.enabled:
            raise InvalidRequestError("lora_name", f"stage {self.stage_id} takes no LoRA adapters (enable_lora)")
        if name in self._loras:
            raise InvalidRequestError("lora_name", f"a LoRA adapter named {name!r} is already loaded")
        if not Path(path).exists():
            raise InvalidRequestError("lora_path", f"{path!r} does not exist")
        lora = LoRARequest(lora_name=name, lora_int_id=next(self._ids), lora_path=str(path))
        try:
            await engine.add_lora(lora)
        except Exception as e:  # vLLM reports a bad adapter (rank, shapes, files) as a plain Exception
            if engine.errored:
                raise
            raise InvalidRequestError("lora_path", str(e).removeprefix("Call to add_lora method failed: ")) from None
        self._loras[name] = lora

    def unload(self, name: str) -> None:
        """As ``vllm serve`` does: the name stops resolving; running requests finish with the adapter (vLLM
        keeps it in its LRU adapter cache)."""
        if self._loras.pop(name, None) is None:
            raise InvalidRequestError("lora_name", f"no LoRA adapter named {name!r} is loaded")

    def request(self, params: Any) -> Any:
        """The LoRARequest a request's params name (``lora``), or None (none named, or a caller's own vLLM
        ``SamplingParams``, which names none)."""
        if not isinstance(params, LLMSamplingParams):
            return None
        name, scale = params.get("lora"), params.get("lora_scale")
        if scale is not None and scale != 1:
            raise InvalidRequestError("lora_scale", f"vLLM applies an adapter at its trained scale; got {scale}")
        if name is None:
            return None
        lora = self._loras.get(name)
        if lora is None:
            raise InvalidRequestError("model", f"the LoRA adapter {name!r} is not loaded on stage {self.stage_id}")
        return lora
