"""What the two Qwen-Omni families (Qwen3-Omni, Qwen2.5-Omni) share: the thinker engine's base, the talker's
sampling, the thinker -> talker edge's first chunk, and the declaration of their two pipelines."""
