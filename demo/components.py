"""The demo model's components: the caption tokenizer, the two CLIP text encoders, the VAE and the
MMDiT (all real diffusers / transformers classes, served by the sd3 family), and the text conditioning
exactly as the SD3 pipeline computes it. ``demo/train_shapes.py`` trains them."""

from __future__ import annotations

import torch

from demo.shapes import vocabulary_words

MAX_TOKENS = 16  # CLIP tokenizer length; captions are at most 13 tokens
T5_TOKENS = 16  # zero tokens the SD3 pipeline appends when there is no T5 encoder
LATENT_CHANNELS = 4
TEXT_WIDTH = 64  # each CLIP encoder's hidden size; the two are concatenated
POOLED_WIDTH = 32  # each CLIP encoder's projection size


def _bpe_merges(words: list[str]) -> list[tuple[str, str]]:
    """Byte-pair merges that turn every word into a single token. Written out here rather than
    taken from ``train_new_from_iterator`` because that trainer breaks ties differently from run
    to run, which changed the token ids and so the trained weights."""
    seqs = [list(w[:-1]) + [w[-1] + "</w>"] for w in sorted(set(words))]
    merges = []
    while True:
        counts: dict[tuple[str, str], int] = {}
        for seq in seqs:
            for pair in zip(seq, seq[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            return merges
        best = min(counts, key=lambda pair: (-counts[pair], pair))  # most frequent, then alphabetical
        merges.append(best)
        for seq in seqs:
            i = 0
            while i < len(seq) - 1:
                if (seq[i], seq[i + 1]) == best:
                    seq[i : i + 2] = [seq[i] + seq[i + 1]]
                i += 1


def build_tokenizer():
    """A CLIP BPE tokenizer over the caption vocabulary: one token per caption word, single
    characters for anything else."""
    from transformers import CLIPTokenizer

    words = vocabulary_words()
    merges = _bpe_merges(words)
    # CLIP's byte-level alphabet: printable bytes map to themselves, the rest to U+0100 onwards.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    alphabet = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(extra))]
    tokens = alphabet + [c + "</w>" for c in alphabet] + ["".join(m) for m in merges]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = CLIPTokenizer(vocab=vocab, merges=list(merges))
    tok.model_max_length = MAX_TOKENS
    return tok


def build_text_encoder(vocab_size: int, tok):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=TEXT_WIDTH,
        intermediate_size=4 * TEXT_WIDTH,
        num_attention_heads=4,
        num_hidden_layers=2,
        max_position_embeddings=MAX_TOKENS,
        projection_dim=POOLED_WIDTH,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return CLIPTextModelWithProjection(cfg)


def build_vae(channels: tuple[int, ...]):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * len(channels),
        up_block_types=("UpDecoderBlock2D",) * len(channels),
        block_out_channels=channels,
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=4,
        sample_size=64,
        mid_block_add_attention=False,
    )


def build_transformer(width: int, layers: int, patch: int):
    from diffusers import SD3Transformer2DModel

    head_dim = 32
    return SD3Transformer2DModel(
        sample_size=16,
        patch_size=patch,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        num_layers=layers,
        attention_head_dim=head_dim,
        num_attention_heads=width // head_dim,
        joint_attention_dim=2 * TEXT_WIDTH,
        caption_projection_dim=width,
        pooled_projection_dim=2 * POOLED_WIDTH,
        pos_embed_max_size=64 // patch,  # up to 256x256 images (trained at 64x64)
    )


def encode_text(tok, encoders, prompts: list[str], device: str = "cpu"):
    """Exactly what StableDiffusion3Pipeline.encode_prompt computes (penultimate hidden state,
    projected pooled output, concatenated, zero T5 tokens appended), but with gradients."""
    ids = tok(prompts, padding="max_length", max_length=MAX_TOKENS, truncation=True, return_tensors="pt").input_ids
    ids = ids.to(device)
    hidden, pooled = [], []
    for enc in encoders:
        out = enc(ids, output_hidden_states=True)
        hidden.append(out.hidden_states[-2])
        pooled.append(out.text_embeds)
    clip = torch.cat(hidden, dim=-1)
    t5 = torch.zeros(len(prompts), T5_TOKENS, clip.shape[-1], device=clip.device)
    return torch.cat([clip, t5], dim=1), torch.cat(pooled, dim=-1)
