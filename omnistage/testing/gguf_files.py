"""Single-file GGUF copies of a tiny folder's component, written with the ``gguf`` package (llama.cpp's own).

    python -m omnistage.testing.gguf_files FOLDER COMPONENT Q8_0 OUT.gguf

Tensor names are the diffusers model's own (as the published Qwen-Image GGUF files have them;
diffusers' ``from_single_file`` takes a checkpoint whose keys already match the model as it is).
2-D weights whose rows split into whole quantization blocks are quantized; every other tensor
(biases, norms, a weight whose row length is no block multiple) stays F32, as llama.cpp's
converters keep such tensors unquantized.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def write_gguf(folder: str | Path, component: str, quant_type: str, out: str | Path) -> Path:
    import gguf
    from safetensors.torch import load_file

    qtype = getattr(gguf.GGMLQuantizationType, quant_type)
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    files = sorted((Path(folder) / component).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors files in {Path(folder) / component}")
    out = Path(out)
    writer = gguf.GGUFWriter(str(out), arch=component)
    for f in files:
        for name, tensor in sorted(load_file(str(f)).items()):
            data = tensor.float().numpy()  # bf16 folders too (numpy has no bfloat16)
            if data.ndim == 2 and data.shape[-1] % block == 0:
                q = gguf.quants.quantize(data, qtype)
                writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
            else:
                writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omnistage.testing.gguf_files", description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("component")
    parser.add_argument("quant_type", help="a GGML type: Q8_0, Q4_0, Q5_0, ...")
    parser.add_argument("out")
    args = parser.parse_args(argv)
    print(write_gguf(args.folder, args.component, args.quant_type, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
