"""The talker's per-request KV caches: the family-independent ones of ``omnistage.stages.ar.kv``."""

from omnistage.stages.ar.kv import RequestKV, StepCache

__all__ = ["RequestKV", "StepCache"]
