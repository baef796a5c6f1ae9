"""Per-row LoRA layers (stages/diffusion/lora.py) on the tiny SD3 transformer, checked against PEFT as
diffusers applies it (``load_lora_adapter`` + ``set_adapters`` with the scale), one row at a time."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file

from omnistage.errors import InvalidRequestError
from omnistage.models.flux.tiny import build_lora as build_flux_lora
from omnistage.models.sd3.tiny import build_lora
from omnistage.stages.diffusion.lora import _ROWS, LoraSet, RowLora, narrow_rows

ROWS = [("a", 1.0), ("b", 0.5), (None, 0.0), ("a", 0.3)]  # (adapter, scale) per row


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    build_lora(root / "a")  # rank 4, lora_alpha 8 in its metadata (scaling 2)
    build_lora(root / "b", seed=1, rank=2, alpha=1.0)
    build_lora(root / "wide", seed=2, rank=32, alpha=32.0)
    build_flux_lora(root / "flux")
    return root


@pytest.fixture(scope="module")
def pipe(tiny_model):
    import diffusers

    return diffusers.StableDiffusion3Pipeline.from_pretrained(str(tiny_model("sd3")))


@pytest.fixture
def loras(pipe, files):
    ls = LoraSet(pipe, torch.device("cpu"), max_loras=3, max_rank=8)
    for name in ("a", "b"):
        ls.load(name, ls.read(str(files / name)))
    yield ls
    ls.close()


def inputs(rows: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden_states=torch.randn(rows, 4, 16, 16, generator=g),
        encoder_hidden_states=torch.randn(rows, 7, 32, generator=g),
        pooled_projections=torch.randn(rows, 64, generator=g),
        timestep=torch.tensor([900.0, 500.0, 300.0, 20.0][:rows]),
        return_dict=False,
    )


def rows_of(ls: LoraSet, spec) -> RowLora:
    return ls.rows_for(tuple((None if n is None else ls._adapters[n].slot, s, 1) for n, s in spec))


@torch.no_grad()
def forward(pipe, kw, rows: RowLora | None = None) -> torch.Tensor:
    token = _ROWS.set(rows)
    try:
        return pipe.transformer(**kw)[0]
    finally:
        _ROWS.reset(token)


@torch.no_grad()
def test_mixed_rows_equal_peft_row_by_row(pipe, loras, files):
    kw = inputs(len(ROWS))
    got = forward(pipe, kw, rows_of(loras, ROWS))
    ref = copy.deepcopy(pipe.transformer)
    for name in ("a", "b"):
        ref.load_lora_adapter(
            str(files / name), weight_name="pytorch_lora_weights.safetensors", adapter_name=name, prefix="transformer"
        )
    for i, (name, scale) in enumerate(ROWS):
        row = {k: (v[i : i + 1] if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        if name is None:
            ref.disable_lora()
        else:
            ref.enable_lora()
            ref.set_adapters([name], weights=[scale])
        want = ref(**row)[0]
        assert (got[i : i + 1] - want).abs().max().item() <= 1e-5, (i, name, scale)
    base = forward(pipe, kw)  # the same batch without any adapter
    assert torch.equal(got[2], base[2])  # the row without an adapter: exactly what the base model gives
    assert (got[0] - base[0]).abs().max().item() > 1e-2  # the adapter does change its rows


@torch.no_grad()
def test_no_rows_set_leaves_the_model_untouched(pipe, loras):
    kw = inputs(2)
    with_hooks = forward(pipe, kw)
    loras.close()
    assert torch.equal(with_hooks, forward(pipe, kw))


@torch.no_grad()
def test_narrowed_rows_keep_their_adapters(pipe, loras):
    kw = inputs(4)
    full = forward(pipe, kw, rows_of(loras, ROWS))
    idx = torch.tensor([0, 3])
    sub = {k: (v.index_select(0, idx) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    token = _ROWS.set(rows_of(loras, ROWS))
    try:
        with narrow_rows(idx):
            part = pipe.transformer(**sub)[0]
        with pytest.raises(RuntimeError, match="narrow_rows"):  # a sub-batch nobody declared
            pipe.transformer(**sub)
    finally:
        _ROWS.reset(token)
    assert (part - full.index_select(0, idx)).abs().max().item() <= 1e-5


def test_unload_drains_then_frees_the_slot(pipe, loras, files):
    use = loras.use("a", 1.0)
    slot = use.slot
    loras.unload("a")
    with pytest.raises(InvalidRequestError) as e:
        loras.use("a", 1.0)
    assert e.value.field == "model"
    layer = next(iter(loras._layers.values()))
    loras.collect()
    assert layer.down[slot].abs().sum() > 0  # still in use by the running request
    use.release()
    loras.collect()
    assert layer.down[slot].abs().sum() == 0
    loras.load("a2", loras.read(str(files / "a")))  # the freed slot is taken again
    assert loras._adapters["a2"].slot == slot


def test_max_loras(pipe, loras, files):
    loras.load("c", loras.read(str(files / "b")))
    with pytest.raises(InvalidRequestError, match="max_loras=3") as e:
        loras.load("d", loras.read(str(files / "b")))
    assert e.value.field == "lora_name"
    with pytest.raises(InvalidRequestError, match="already loaded"):
        loras.load("c", loras.read(str(files / "b")))


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "does not exist"),
        ("flux", "another base model"),
        ("wide", "rank 32, above this server's max_lora_rank of 8"),
        ("text_encoder", "only the denoiser's layers"),
    ],
)
def test_bad_files_name_lora_path(pipe, files, tmp_path, case, message):
    ls = LoraSet(pipe, torch.device("cpu"), max_loras=2, max_rank=8)
    path = {"missing": tmp_path / "nope", "flux": files / "flux", "wide": files / "wide"}.get(case)
    if case == "text_encoder":
        sd = load_file(files / "a" / "pytorch_lora_weights.safetensors")
        sd["text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight"] = torch.zeros(4, 32)
        sd["text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_B.weight"] = torch.zeros(32, 4)
        path = tmp_path / "te.safetensors"
        save_file(sd, path)
    with pytest.raises(InvalidRequestError, match=message) as e:
        ls.read(str(path))
    assert e.value.field == "lora_path"


@torch.no_grad()
def test_old_diffusers_layout_reads_as_peft(pipe, files, tmp_path):
    """A file in diffusers' older ``.lora.down`` / ``.lora.up`` layout (no metadata: scaling 1) is converted
    by diffusers' own helper and gives the same layers as the PEFT layout."""
    sd = load_file(files / "b" / "pytorch_lora_weights.safetensors")
    old = {
        k.replace(".lora_A.weight", ".lora.down.weight").replace(".lora_B.weight", ".lora.up.weight"): v
        for k, v in sd.items()
    }
    save_file(old, tmp_path / "old.safetensors")
    ls = LoraSet(pipe, torch.device("cpu"), max_loras=2, max_rank=8)
    got, want = ls.read(str(tmp_path / "old.safetensors")), ls.read(str(files / "b"))
    assert got.layers.keys() == want.layers.keys()
    for key, w in want.layers.items():
        assert torch.equal(got.layers[key].down, w.down) and torch.equal(got.layers[key].up, w.up)
        assert got.layers[key].scaling == 1.0 and w.scaling == 0.5  # b's metadata: alpha 1 / rank 2
