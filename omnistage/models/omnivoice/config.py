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
