"""Run a Python script with only the packages the GPU machine has: its image's own (listed below, as
the device tool's KINDS.md read them on 2026-11-17) plus the wheels scripts/gpu_check.sh carries.

    python tests/bench/device_image.py SCRIPT ARGS...

Installed distributions outside that set are hidden (their modules cannot be imported, their metadata
is not found), so a new import on the GPU check's path that the machine lacks fails here, in the test
suite, instead of in a lent session. Versions are not emulated: only presence.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import re
import runpy
import sys
from pathlib import Path

IMAGE_PACKAGES = """
    absl-py, accelerate, aiofiles, aiohappyeyeballs, aiohttp, aiosignal, annotated-doc, anyio, attrs, botorch,
    build, certifi, charset-normalizer, chex, click, cloudpickle, cmake, colorama, contourpy, coverage,
    cuda-bindings, cuda-core, cuda-pathfinder, cuda-toolkit, cupy-cuda13x, cycler, cython, diffrax, e3nn, einops,
    equinox, etils, execnet, filelock, flatbuffers, flax, fonttools, formulaic, frozenlist, fsspec, gpytorch,
    grpcio, h11, h5py, hf-xet, httpcore, httpx, huggingface-hub, humanize, hypothesis, idna, imageio, iniconfig,
    interface-meta, jax, jax-cuda13-pjrt, jax-cuda13-plugin, jaxlib, jaxtyping, jinja2, joblib, kiwisolver,
    lazy-loader, lightning, lightning-utilities, linear-operator, lineax, llvmlite, lxml, markdown,
    markdown-it-py, markupsafe, matplotlib, mdurl, meson, ml-dtypes, mpi4py, mpmath, msgpack, multidict,
    multipledispatch, mypy-extensions, nanobind, narwhals, networkx, ninja, numba, numba-cuda, numpy, numpyro,
    nvidia-cublas, nvidia-cuda-cupti, nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cudnn-cu13, nvidia-cufft,
    nvidia-cufile, nvidia-curand, nvidia-cusolver, nvidia-cusparse, nvidia-cusparselt-cu13, nvidia-ml-py,
    nvidia-nccl-cu13, nvidia-nvjitlink, nvidia-nvshmem-cu13, nvidia-nvtx, onnx, onnx-ir, onnxruntime, onnxscript,
    opencv-python-headless, optax, opt-einsum, opt-einsum-fx, optimistix, orbax-checkpoint, packaging, pandas,
    pathspec, patsy, peft, pillow, pip, pluggy, portalocker, prometheus-client, propcache, protobuf, psutil,
    pyarrow, pybind11, py-cpuinfo, pygments, pyparsing, pyproject-hooks, pyre-extensions, pytest,
    pytest-benchmark, pytest-cov, pytest-mock, pytest-timeout, pytest-xdist, python-dateutil, pytorch-lightning,
    pyyaml, regex, requests, rich, sacrebleu, safetensors, scikit-build-core, scikit-image, scikit-learn, scipy,
    seaborn, sentencepiece, sentence-transformers, setuptools, shellingham, simplejson, six, sortedcontainers,
    statsmodels, sympy, tabulate, tensorboard, tensorboard-data-server, tensorstore, threadpoolctl, tifffile,
    tiktoken, timm, tokenizers, toolz, torch, torchaudio, torchdiffeq, torch-geometric, torchmetrics,
    torchvision, tqdm, transformers, treescope, triton, typer, typing-extensions, typing-inspect, urllib3,
    uvloop, wadler-lindig, werkzeug, wheel, wrapt, xarray, xxhash, yarl, zipp
"""

ROOT = Path(__file__).resolve().parents[2]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def allowed_distributions() -> set[str]:
    """The image's packages and the wheels named in gpu_check.sh's pip download line."""
    carried = re.findall(r"([A-Za-z0-9_.-]+)==", (ROOT / "scripts" / "gpu_check.sh").read_text())
    image = [p.strip() for p in IMAGE_PACKAGES.replace("\n", " ").split(",") if p.strip()]
    return {_norm(n) for n in image + carried}


def with_local_dependencies(names: set[str]) -> set[str]:
    """Add what the allowed distributions, as installed here, require (not their extras): versions here
    differ from the machine's (huggingface-hub 2 here needs httpx2, 1.33 there does not), and a library's
    own needs are not what this filter is about."""
    from packaging.requirements import Requirement

    todo, seen = list(names), set(names)
    while todo:
        try:
            requires = importlib.metadata.distribution(todo.pop()).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if _norm(req.name) not in seen:
                seen.add(_norm(req.name))
                todo.append(_norm(req.name))
    return seen


def hidden_modules(allowed: set[str]) -> set[str]:
    """Top-level modules that only distributions outside allowed provide."""
    return {
        top
        for top, dists in importlib.metadata.packages_distributions().items()
        if not any(_norm(d) in allowed for d in dists)
    }


class _ImageFinder(importlib.abc.MetaPathFinder):
    """The standard path finder, blind to the hidden modules and distributions."""

    def __init__(self, hidden: set[str], allowed: set[str]):
        self.hidden, self.allowed = hidden, allowed

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.hidden:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    def find_distributions(self, *args, **kwargs):
        for d in importlib.machinery.PathFinder.find_distributions(*args, **kwargs):
            if _norm(d.metadata["Name"] or "") in self.allowed:
                yield d

    def invalidate_caches(self):
        importlib.machinery.PathFinder.invalidate_caches()


def main() -> None:
    # omnistage runs from the checkout there; its own declared needs are exactly what is under test
    allowed = with_local_dependencies(allowed_distributions()) | {"omnistage"}
    finder = _ImageFinder(hidden_modules(allowed), allowed)
    sys.meta_path[:] = [finder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(sys.argv[0]).resolve().parent)
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
