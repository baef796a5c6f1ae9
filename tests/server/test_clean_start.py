"""A start of ``omnistage serve`` prints nothing the project did not write, and torchao, which the command keeps
unimported until a stage asks for it (omnistage/torchao_gate.py), still quantizes when one does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
import torch

pytestmark = pytest.mark.slow

# what may reach stderr: the project's log lines (basicConfig's format: time, level, logger), at any level from
# omnistage's loggers and INFO from others (uvicorn's access and lifecycle lines among them), and uvicorn's own
# "INFO:     Started server process" lines
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<logger>[\w.]+): ")
_UVICORN_INFO = re.compile(r"^INFO: {5}")


def foreign_lines(stderr: str) -> list[str]:
    """The stderr lines the project did not write (a library's warning, a deprecation, a bare print)."""
    out = []
    continued = False  # a project log record's message may span lines (a traceback it logs is its own)
    for line in stderr.splitlines():
        m = _LOG_LINE.match(line)
        if m:
            ours = m["logger"].split(".")[0] == "omnistage" or m["level"] == "INFO"
            continued = ours
            if not ours:
                out.append(line)
        elif _UVICORN_INFO.match(line):
            continued = False
        elif line.strip() and not continued:
            out.append(line)
    return out


def test_foreign_lines_finds_what_a_start_used_to_print():
    """The filter itself: the lines a start printed before torchao was kept out are caught, ours are not."""
    before = textwrap.dedent("""\
        INFO:     Started server process [24026]
        W1207 14:15:11.081000 24026 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum subclass
        Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with `torchao`
        2026-12-07 14:15:21,543 INFO omnistage.engine.builder: stage 0 (diffusion0) ready: 1 replica(s)
        2026-12-07 14:15:21,600 WARNING diffusers.models.modeling_utils: some library warning
        2026-12-07 14:15:21,700 WARNING omnistage.serve: a warning of ours
        """)
    assert foreign_lines(before) == [
        "W1207 14:15:11.081000 24026 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum subclass",
        "Unable to import `torchao` Tensor objects. This may affect loading checkpoints serialized with `torchao`",
        "2026-12-07 14:15:21,600 WARNING diffusers.models.modeling_utils: some library warning",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_starts_and_stops_without_foreign_warnings(tmp_path):
    """The built-in demo (a tiny SD3 folder shipped with the package) served, asked once, stopped."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("OMNISTAGE_TORCHAO", None)
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("omnistage")), "serve", "--port", str(port)],  # the installed command
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
        try:
            deadline = time.monotonic() + 240  # stops a hang; a start takes ~20 s on 2 busy cores
            while True:
                assert proc.poll() is None, err.read_text()
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.5)
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/images/generations",
                json={"prompt": "a red circle on the left", "num_inference_steps": 2},
                timeout=120,
            )
            assert r.status_code == 200, r.text
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = err.read_text()
    assert "omnistage.serve: ready" in text  # the log was captured, so an empty list below means something
    assert foreign_lines(text) == [], text


_HIDDEN = """
import sys
from omnistage import torchao_gate
torchao_gate.hide_unless_named(["serve", sys.argv[1]])  # as the omnistage command does first: nothing names torchao
import diffusers, transformers.modeling_utils  # what a start imports
assert sys.modules["torchao"] is None, "torchao was imported"
try:
    torchao_gate.require("stages[0].quantization")
except RuntimeError as e:
    print(e)
"""

_QUANTIZE = """
import sys, torch
from omnistage import torchao_gate
torchao_gate.hide_unless_named(["serve", sys.argv[1], "--deploy-config", sys.argv[3]])  # the YAML names torchao
import diffusers
assert sys.modules.get("torchao", "not hidden") is not None
from omnistage.config.stage_sections import QuantizationConfig
from omnistage.stages.diffusion.quantization import load_arguments
q = QuantizationConfig(quant_backend="torchao", quant_kwargs={"quant_type": "int8wo"})
kwargs = load_arguments(q, sys.argv[1], torch.float32, "quantization")
t = diffusers.FluxTransformer2DModel.from_pretrained(
    sys.argv[1], subfolder="transformer", torch_dtype=torch.float32,
    quantization_config=kwargs["quantization_config"].quant_mapping["transformer"])
w = t.transformer_blocks[0].attn.to_q.weight
torch.save({"type": type(w).__name__, "weight": w.dequantize()}, sys.argv[2])
"""

DEPLOY = """
stages:
  - stage_id: 0
    quantization: {quant_backend: torchao, quant_kwargs: {quant_type: int8wo}}
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("OMNISTAGE_TORCHAO", None)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)


def test_a_command_that_names_no_torchao_never_imports_it(tiny_model):
    """Hidden: diffusers and transformers import as without torchao, and asking for it says how to get it."""
    run = _python(_HIDDEN, str(tiny_model("flux")))
    assert run.returncode == 0, run.stderr
    assert "OMNISTAGE_TORCHAO=enabled" in run.stdout and "stages[0].quantization" in run.stdout


def test_a_command_whose_deploy_names_torchao_quantizes_as_diffusers_does(tiny_model, tmp_path):
    """Named in the deploy YAML: torchao is imported as usual, and the weights equal those diffusers quantizes
    in this process."""
    from diffusers import FluxTransformer2DModel, TorchAoConfig
    from torchao.quantization import Int8WeightOnlyConfig

    flux = str(tiny_model("flux"))
    out, deploy = tmp_path / "weight.pt", tmp_path / "deploy.yaml"
    deploy.write_text(DEPLOY)
    run = _python(_QUANTIZE, flux, str(out), str(deploy))
    assert run.returncode == 0, run.stderr
    got = torch.load(out)
    ref = (
        FluxTransformer2DModel.from_pretrained(
            flux,
            subfolder="transformer",
            quantization_config=TorchAoConfig(Int8WeightOnlyConfig()),
            torch_dtype=torch.float32,
        )
        .transformer_blocks[0]
        .attn.to_q.weight
    )
    assert got["type"] == type(ref).__name__ != "Parameter"
    assert torch.equal(got["weight"], ref.dequantize())
