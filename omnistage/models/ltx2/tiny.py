"""Tiny LTX-2 folders: real classes (LTX2VideoTransformer3DModel, Gemma 3, both LTX-2 VAEs, the vocoder, the text
connectors), random weights, a locally trained Gemma tokenizer. Sizes: multiples of 32, frame counts 2k+1 (this
video VAE compresses time and space by 2, the release's by 8 and 32; patch size 1).

Two layouts of the same classes: LTX-2.0 (one text projection shared by both modalities, in the DiT) and LTX-2.3
(``version="2.3"``: per-modality text projections in the connectors, gated attention, learnable registers, prompt
cross-attention modulation, and a vocoder with bandwidth extension), as the released folders set them."""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts


def gemma_tokenizer():
    from transformers import GemmaTokenizerFast

    tok = GemmaTokenizerFast().train_new_from_iterator(parts._CORPUS * 4, vocab_size=300)
    tok.model_max_length = 1024
    return tok


def gemma3(vocab_size: int = 300):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    text = dict(
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=vocab_size,
        max_position_embeddings=1024,
        sliding_window=64,
    )
    vision = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=16
    )
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    return Gemma3ForConditionalGeneration(cfg).eval()


def components(version: str = "2.0"):
    import torch
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    v23 = version == "2.3"
    text_encoder = gemma3()
    # the connectors' width (heads x head_dim = 32) is the text encoder's hidden size
    hidden, layers = text_encoder.config.text_config.hidden_size, text_encoder.config.text_config.num_hidden_layers
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        # perturbed_attn: the LTX-2.3 blocks whose self-attention STG can skip (else STG changes nothing)
        caption_channels=hidden,
        rope_double_precision=False,
        rope_type="split",
        perturbed_attn=True,
        # LTX-2.3: gated attention, cross-attention modulated by the prompt, the text projected in the connectors
        gated_attn=v23,
        cross_attn_mod=v23,
        audio_gated_attn=v23,
        audio_cross_attn_mod=v23,
        use_prompt_embeddings=not v23,
    ).eval()
    # LTX-2.0's connectors run at the text encoder's width (4 x 8 = 32), LTX-2.3's at the DiT's per modality
    video_heads, video_dim = (2, 8) if v23 else (4, 8)
    audio_heads, audio_dim = (2, 4) if v23 else (4, 8)
    connectors = LTX2TextConnectors(
        caption_channels=hidden,
        text_proj_in_factor=layers + 1,
        video_connector_num_attention_heads=video_heads,
        video_connector_attention_head_dim=video_dim,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=8 if v23 else None,  # divides max_sequence_length (16 in tests)
        video_gated_attn=v23,
        audio_connector_num_attention_heads=audio_heads,
        audio_connector_attention_head_dim=audio_dim,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8 if v23 else None,
        audio_gated_attn=v23,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
        # LTX-2.3: one projection per modality, to the DiT's video / audio widths
        per_modality_projections=v23,
        video_hidden_dim=video_heads * video_dim,
        audio_hidden_dim=audio_heads * audio_dim,
        proj_bias=v23,
    ).eval()
    vae = video_vae()  # (the construction order is the seeded weights' order: keep it)
    audio_vae, vocoder = audio_decoder(v23)
    # the released checkpoints' scheduler: dynamic (resolution-dependent) shift, as LTX-2's scheduler_config
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True,
        base_shift=0.95,
        max_shift=2.05,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        shift_terminal=0.1,
    )
    return dict(
        transformer=transformer,
        vae=vae,
        audio_vae=audio_vae,
        scheduler=scheduler,
        text_encoder=text_encoder,
        tokenizer=gemma_tokenizer(),
        connectors=connectors,
        vocoder=vocoder,
    )


def video_vae():
    from diffusers import AutoencoderKLLTX2Video

    return AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    ).eval()


def audio_decoder(v23: bool):
    """The audio VAE and the vocoder after it (2.3's with bandwidth extension)."""
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    ).eval()
    vocoder = (
        bwe_vocoder(audio_vae)
        if v23
        else LTX2Vocoder(
            # upsampling 10 x 4 x 4 = the mel hop (160): the waveform lasts as long as the video, as in the release
            in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
            hidden_channels=32,
            out_channels=2,
            upsample_kernel_sizes=[20, 8, 8],
            upsample_factors=[10, 4, 4],
            resnet_kernel_sizes=[3],
            resnet_dilations=[[1, 3, 5]],
            leaky_relu_negative_slope=0.1,
            output_sampling_rate=16000,
        )
    ).eval()
    return audio_vae, vocoder


def bwe_vocoder(audio_vae):
    """LTX-2.3's vocoder: the LTX-2 vocoder at 16 kHz, then a bandwidth extender (a second vocoder over the first
    one's mel spectrogram, plus the first one's waveform resampled) to 32 kHz here (48 kHz in the class's default
    config)."""
    from diffusers.pipelines.ltx2.vocoder import LTX2VocoderWithBWE

    return LTX2VocoderWithBWE(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[20, 8, 8],
        upsample_factors=[10, 4, 4],  # the mel hop (160), as the LTX-2 vocoder
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        antialias_kernel_size=4,
        bwe_in_channels=2 * 16,  # stereo x its mel bins
        bwe_hidden_channels=16,
        bwe_out_channels=2,
        bwe_upsample_kernel_sizes=[20, 8, 8],
        bwe_upsample_factors=[10, 4, 4],  # its hop (80) x the rate ratio (2)
        bwe_resnet_kernel_sizes=[3],
        bwe_resnet_dilations=[[1, 3, 5]],
        bwe_antialias_kernel_size=4,
        filter_length=128,
        hop_length=80,
        window_length=128,
        num_mel_channels=16,
        input_sampling_rate=16000,
        output_sampling_rate=32000,
    )


def build(outdir: Path) -> None:
    """Write a loadable LTX2Pipeline folder (text -> video + audio), with the two-stage recipe's latent upsampler in
    ``latent_upsampler/`` (as the release keeps it: beside the pipeline, not in ``model_index.json``)."""
    import torch
    from diffusers import LTX2Pipeline

    torch.manual_seed(0)
    pipe = LTX2Pipeline(**components())
    pipe.save_pretrained(outdir, safe_serialization=True)
    latent_upsampler().save_pretrained(Path(outdir) / "latent_upsampler", safe_serialization=True)


def latent_upsampler():
    """The 2x spatial latent upsampler at toy width (GroupNorm needs 32 channels), seeded on its own so the
    pipeline's weights above stay what they were."""
    import torch
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    torch.manual_seed(1)
    return LTX2LatentUpsamplerModel(
        in_channels=4, mid_channels=32, num_blocks_per_stage=1, dims=3, rational_spatial_scale=2.0
    ).eval()


def build_i2v(outdir: Path) -> None:
    """Write a loadable LTX2ImageToVideoPipeline folder (first frame + text -> video + audio)."""
    import torch
    from diffusers import LTX2ImageToVideoPipeline

    torch.manual_seed(0)
    pipe = LTX2ImageToVideoPipeline(**components())
    pipe.save_pretrained(outdir, safe_serialization=True)


def build_v23(outdir: Path) -> None:
    """Write a loadable LTX2Pipeline folder in the LTX-2.3 layout (text -> video + audio)."""
    import torch
    from diffusers import LTX2Pipeline

    torch.manual_seed(0)
    pipe = LTX2Pipeline(**components("2.3"))
    pipe.save_pretrained(outdir, safe_serialization=True)
