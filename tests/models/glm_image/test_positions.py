"""GLM-Image's M-RoPE positions and the layout ids carried through vLLM's delta
(``omnistage.models.glm_image.positions``), against transformers' ``get_rope_index``
and vLLM's own decode-position rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.models.glm_image.grid import generated_layout, target_grids
from omnistage.models.glm_image.positions import (
    MAX_IDS,
    MAX_STEPS,
    DecodeLayouts,
    decode,
    encode,
    grid_positions,
    is_encoded,
    prompt_positions,
)


def test_encode_decode_round_trip_and_bounds():
    for layout_id, step in [(1, 0), (1, MAX_STEPS - 1), (MAX_IDS, 0), (MAX_IDS, MAX_STEPS - 1), (5, 123)]:
        p = encode(layout_id, step)
        assert decode(p) == (layout_id, step)
        assert MAX_STEPS <= p < 2**31  # never a prompt position, and fits vLLM's int32 deltas
    assert not bool(is_encoded(torch.tensor([0, MAX_STEPS - 1])).any())
    for layout_id, step, field in [
        (0, 0, "layout_id"),
        (MAX_IDS + 1, 0, "layout_id"),
        (1, -1, "step"),
        (1, MAX_STEPS, "step"),
    ]:
        with pytest.raises(ValueError, match=field):
            encode(layout_id, step)


def test_max_model_len_must_leave_room_for_the_id():
    DecodeLayouts(MAX_STEPS - 1)
    with pytest.raises(ValueError, match="max_model_len"):
        DecodeLayouts(MAX_STEPS)


def _vllm_decode_positions(delta: int, prompt_len: int, count: int) -> torch.Tensor:
    """The positions vLLM's model runner gives a request's first ``count`` generated tokens."""
    from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding

    out = np.zeros((3, count), dtype=np.int64)
    MRotaryEmbedding.get_next_input_positions_tensor(
        out=out, out_offset=0, mrope_position_delta=delta, context_len=prompt_len, num_new_tokens=count
    )
    return torch.from_numpy(out)


# grids (1, 2) then (2, 2) drawn from position 10: the second grid starts max(1, 2) = 2 later
SMALL_GRIDS = [(1, 2), (2, 2)]
SMALL_TABLE = torch.tensor([[10, 10, 12, 12, 12, 12, 14], [10, 10, 12, 12, 13, 13, 14], [10, 11, 12, 13, 12, 13, 14]])


def test_delta_turns_vllm_decode_positions_into_the_grid():
    layouts = DecodeLayouts(1024)
    delta = layouts.delta(10, SMALL_GRIDS, prompt_len=9)
    got = layouts.resolve(_vllm_decode_positions(delta, 9, 9))  # two steps past the table's end
    expected = torch.cat([SMALL_TABLE, SMALL_TABLE[:, -1:], SMALL_TABLE[:, -1:]], dim=1)
    assert torch.equal(got, expected)


def test_requests_in_one_batch_keep_their_own_layouts():
    layouts = DecodeLayouts(1024)
    a = layouts.delta(10, SMALL_GRIDS, prompt_len=9)
    b = layouts.delta(4, [(1, 1)], prompt_len=3)
    c = layouts.delta(10, SMALL_GRIDS, prompt_len=5)  # same layout as a, other prompt
    assert len(layouts) == 2 and a + 9 == c + 5
    prompt = torch.arange(3).expand(3, -1)  # a prefill chunk in the same batch
    batch = torch.cat(
        [
            prompt,
            _vllm_decode_positions(a, 9, 3)[:, 2:],
            _vllm_decode_positions(b, 3, 2)[:, 1:],
            _vllm_decode_positions(c, 5, 1),
        ],
        dim=1,
    )
    expected = torch.cat([prompt, SMALL_TABLE[:, 2:3], torch.full((3, 1), 5), SMALL_TABLE[:, 0:1]], dim=1)
    assert torch.equal(layouts.resolve(batch), expected)
    assert layouts.resolve(prompt) is prompt  # prefill-only batches pass through untouched


def test_least_recently_used_id_is_recycled():
    layouts = DecodeLayouts(1024, max_ids=2)
    a = layouts.delta(10, SMALL_GRIDS, prompt_len=9)  # id 1
    layouts.delta(4, [(1, 1)], prompt_len=3)  # id 2
    layouts.resolve(_vllm_decode_positions(a, 9, 1))  # a decodes: id 1 is in use
    c = layouts.delta(7, [(1, 3)], prompt_len=6)  # recycles id 2, not a's
    assert len(layouts) == 2
    assert torch.equal(
        layouts.resolve(_vllm_decode_positions(c, 6, 4)), torch.tensor([[7, 7, 7, 10], [7, 7, 7, 10], [7, 8, 9, 10]])
    )
    assert torch.equal(layouts.resolve(_vllm_decode_positions(a, 9, 2)), SMALL_TABLE[:, :2])
    with pytest.raises(RuntimeError, match="layout id 3"):
        layouts.resolve(torch.full((3, 1), encode(3, 0)))


def test_ids_read_in_one_batch_are_touched_in_column_order():
    layouts = DecodeLayouts(1024, max_ids=2)
    a = layouts.delta(10, SMALL_GRIDS, prompt_len=9)
    b = layouts.delta(4, [(1, 1)], prompt_len=3)
    step = lambda delta, prompt_len: _vllm_decode_positions(delta, prompt_len, 1)  # noqa: E731
    layouts.resolve(torch.cat([step(a, 9), step(b, 3), step(a, 9)], dim=1))  # a's column comes last
    layouts.delta(7, [(1, 3)], prompt_len=6)  # recycles b's id
    assert torch.equal(layouts.resolve(step(a, 9)), SMALL_TABLE[:, :1])


# ---------------------------------------------------------------- against transformers


@pytest.fixture(scope="module")
def reference():
    """The tiny GLM-Image processor and transformers model (config-only use: get_rope_index)."""
    from transformers import GlmImageProcessor

    from omnistage.models.glm_image import tiny

    tok = tiny.ar_tokenizer()
    processor = GlmImageProcessor(
        image_processor=tiny.image_processor(), tokenizer=tok, chat_template=tiny.CHAT_TEMPLATE
    )
    return processor, tiny.ar_model(tok).model


def _image(seed: int, height: int, width: int):
    from PIL import Image

    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    "height,width,sources", [(64, 96, []), (96, 32, []), (64, 64, [(64, 96)]), (32, 64, [(64, 64), (96, 64)])]
)
def test_positions_equal_transformers_get_rope_index(reference, height, width, sources):
    processor, model = reference
    images = [_image(i, h, w) for i, (h, w) in enumerate(sources)]
    content = [{"type": "image", "image": im} for im in images] + [{"type": "text", "text": "a red cat"}]
    inputs = processor.apply_chat_template(
        [[{"role": "user", "content": content}]],
        tokenize=True,
        target_h=height,
        target_w=width,
        return_dict=True,
        return_tensors="pt",
    )
    ids = inputs["input_ids"]
    ref_prompt, _ = model.get_rope_index(ids, inputs["image_grid_thw"], attention_mask=inputs["attention_mask"])
    # the reference keeps its decode positions on the model (no public return path)
    ref_decode = model._cached_decode_position_ids[0]

    image_token = processor.tokenizer.convert_tokens_to_ids("<|image|>")
    is_image = (ids[0] == image_token).tolist()
    offsets = [i for i, v in enumerate(is_image) if v and (i == 0 or not is_image[i - 1])]
    grids = inputs["image_grid_thw"][: len(sources)].tolist()
    got_prompt, first = prompt_positions(ids.shape[1], [(o, h, w) for o, (_, h, w) in zip(offsets, grids)])
    assert torch.equal(got_prompt, ref_prompt[:, 0])

    target, preview = target_grids(height, width)
    order = [target] if sources else [preview, target]  # t2i draws the preview first
    got_decode = grid_positions(first, order)
    assert got_decode.shape[1] == generated_layout(height, width, bool(sources))[1]
    assert torch.equal(got_decode, ref_decode)
