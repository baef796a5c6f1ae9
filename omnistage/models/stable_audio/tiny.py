"""Tiny Stable Audio folder: real classes (StableAudioDiTModel, T5 encoder, StableAudioProjectionModel,
AutoencoderOobleck, EDMDPMSolverMultistepScheduler), random weights.

Sizes: a 16 kHz stereo Oobleck VAE with hop 32 and a DiT over 125 latent frames, so a request may ask up to
125 x 32 / 16000 = 0.25 s of audio (16 kHz: a rate every response format, MP3's included, can carry). The scheduler is Stable Audio Open 1.0's (exponential EDM sigmas, v-prediction,
SDE DPM-Solver++ drawing noise in every step).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts

SAMPLE_RATE = 16000
LATENT_FRAMES = 125  # the DiT's sample_size: every request denoises this many frames, whatever its duration
LATENT_CHANNELS = 4
TEXT_DIM = 32
TOKENS = 16  # the tokenizer's model_max_length: every prompt is padded to it
MAX_SECONDS = 0.25  # LATENT_FRAMES x the VAE's hop 32 / SAMPLE_RATE: the longest clip


def transformer():
    from diffusers import StableAudioDiTModel

    return StableAudioDiTModel(
        sample_size=LATENT_FRAMES,
        in_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        num_key_value_attention_heads=1,
        out_channels=LATENT_CHANNELS,
        cross_attention_dim=16,
        time_proj_dim=16,
        global_states_input_dim=2 * TEXT_DIM,  # the start and end seconds' embeddings side by side
        cross_attention_input_dim=TEXT_DIM,
    ).eval()


def vae():
    from diffusers import AutoencoderOobleck

    return AutoencoderOobleck(
        encoder_hidden_size=4,
        downsampling_ratios=[4, 8],
        channel_multiples=[1, 2],
        decoder_channels=4,
        decoder_input_channels=LATENT_CHANNELS,
        audio_channels=2,
        sampling_rate=SAMPLE_RATE,
    ).eval()


def build(outdir: Path) -> None:
    """Write a loadable StableAudioPipeline folder."""
    import torch
    from diffusers import EDMDPMSolverMultistepScheduler, StableAudioPipeline
    from diffusers.pipelines.stable_audio.modeling_stable_audio import StableAudioProjectionModel

    torch.manual_seed(0)
    tok = parts.t5_tokenizer()
    tok.model_max_length = TOKENS
    pipe = StableAudioPipeline(
        vae=vae(),
        text_encoder=parts.t5_encoder(d_model=TEXT_DIM, vocab_size=len(tok)),
        projection_model=StableAudioProjectionModel(
            text_encoder_dim=TEXT_DIM, conditioning_dim=TEXT_DIM, min_value=0, max_value=512
        ).eval(),
        tokenizer=tok,
        transformer=transformer(),
        # stabilityai/stable-audio-open-1.0's scheduler config
        scheduler=EDMDPMSolverMultistepScheduler(
            sigma_min=0.3,
            sigma_max=500.0,
            sigma_data=1.0,
            sigma_schedule="exponential",
            prediction_type="v_prediction",
            algorithm_type="sde-dpmsolver++",
            solver_order=2,
            final_sigmas_type="zero",
        ),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
