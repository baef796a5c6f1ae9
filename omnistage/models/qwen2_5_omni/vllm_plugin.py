"""vLLM general plugin (entry point ``vllm.general_plugins``): registers the Qwen2.5-Omni thinker with
transformers' M-RoPE positions (``vllm_thinker.py``), and the same thinker that also hands out its hidden states
(``vllm_speaking.py``), with vLLM's public ``ModelRegistry`` in every vLLM process."""

THINKER_ARCHITECTURE = "OmnistageQwen2_5OmniThinker"
SPEAKING_ARCHITECTURE = "OmnistageQwen2_5OmniThinkerSpeaking"


def register() -> None:
    from vllm import ModelRegistry

    known = ModelRegistry.get_supported_archs()
    for name, where in (
        (THINKER_ARCHITECTURE, "vllm_thinker:Qwen2_5OmniThinkerForVLLM"),
        (SPEAKING_ARCHITECTURE, "vllm_speaking:Qwen2_5OmniThinkerSpeakingForVLLM"),
    ):
        if name not in known:
            ModelRegistry.register_model(name, f"omnistage.models.qwen2_5_omni.{where}")
