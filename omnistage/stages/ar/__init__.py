"""Step-batched autoregressive stages over transformers modules (multi-codebook talkers and backbones):
``engine.StepEngine`` (admission at step boundaries, one batched step per round, per-request state),
``kv`` (per-request KV caches attended as one right-padded batch), ``sampling`` (per-request seeded
sampling as transformers does it). Used by ``csm``; ``qwen_omni``'s talker uses ``kv`` and ``sampling``."""
