"""vLLM general plugin (entry point ``vllm.general_plugins``): registers GLM-Image's AR model
with vLLM's public ``ModelRegistry`` in every vLLM process (the engine core runs in its own)."""

ARCHITECTURE = "GlmImageForConditionalGeneration"


def register() -> None:
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "omnistage.models.glm_image.vllm_model:GlmImageARForVLLM")
