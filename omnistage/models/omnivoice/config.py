"""OmniVoice's constants: the release's audio rates and the reference package's generation defaults
(``OmniVoiceGenerationConfig``) that the code generator reads."""

from __future__ import annotations

MODEL_TYPE = "omnivoice"  # config.json model_type of k2-fsa's release
SAMPLE_RATE = 24000  # the Higgs Audio v2 tokenizer's rate
FRAME_RATE = 25
NUM_STEP = 32
GUIDANCE_SCALE = 2.0
T_SHIFT = 0.1
LAYER_PENALTY_FACTOR = 5.0
POSITION_TEMPERATURE = 5.0

ARCHITECTURE = "OmniVoice"  # config.json architectures of the release
VOICES = ["default"]  # the model's own voice for the text; voice design through instructions
MAX_REF_AUDIO_S = 30.0  # the longest reference clip a request may clone from
MAX_DURATION_S = 60.0  # the longest speech one request may ask for (duration, or the estimate at its speed)
# the stage's params: the unmasking knobs of the package's generation config, the seed, and a fixed length
PARAM_KEYS = {
    "num_inference_steps",
    "guidance_scale",
    "t_shift",
    "layer_penalty_factor",
    "position_temperature",
    "seed",
    "duration",
}
