"""Start the authors' ``moshi.server`` (0.2.13, its own code) on a Moshi folder in the authors' layout, for the
duplex benchmark's side-by-side run (benchmarks/duplex.py).

    python serve_reference.py FOLDER PORT [DEVICE=cpu]

Three things stand between the released server and a local folder on a machine without a GPU, and are set here
without touching the server's code:

- ``config.json`` names its Mimi config relatively, which the loader would fetch from the Hugging Face Hub: the
  server gets a copy of the config naming it as ``file://`` (the loader's own way to force a local file);
- its warm-up ends with ``torch.cuda.synchronize()``, which raises without a GPU: a no-op on the CPU;
- it loads the LM in bfloat16 (or float16 with ``--half``): on the CPU in float32, as omnistage does there.
"""

from __future__ import annotations

import json
import runpy
import sys
import tempfile
from pathlib import Path

import torch
from moshi.models import loaders


def main(folder: Path, port: int, device: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["mimi_config_name"] = "file://" + str((folder / config["mimi_config_name"]).resolve())
    # the persona's codes (persona_silence_codes, persona_sine_codes) are omnistage's keys: the authors' LM takes
    # every other key as a constructor argument and refuses these
    config = {k: v for k, v in config.items() if not k.startswith("persona_")}
    local = Path(tempfile.mkdtemp(prefix="moshi-server-")) / "config.json"
    local.write_text(json.dumps(config))
    if device == "cpu":
        torch.cuda.synchronize = lambda *args, **kwargs: None
        get_moshi = loaders.CheckpointInfo.get_moshi
        loaders.CheckpointInfo.get_moshi = lambda self, *a, **kw: get_moshi(self, *a, **{**kw, "dtype": torch.float32})
    sys.argv = [
        "moshi.server",
        *("--host", "127.0.0.1", "--port", str(port), "--device", device, "--static", "none"),
        *("--config-path", str(local), "--moshi-weight", str(folder / config["moshi_name"])),
        *("--mimi-weight", str(folder / config["mimi_name"]), "--tokenizer", str(folder / config["tokenizer_name"])),
    ]
    runpy.run_module("moshi.server", run_name="__main__")  # the module serves as it is imported


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "cpu")
