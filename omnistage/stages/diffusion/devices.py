"""Which device a diffusion replica (or one rank of a multi-device replica) runs on, and its process-group
backend. Kept apart from engine.py and parallel/ so both can use it without importing each other."""

from __future__ import annotations

import torch


def resolve_device(devices: list[str] | None) -> torch.device:
    if devices and torch.cuda.is_available():
        return torch.device(f"cuda:{devices[0]}")
    return torch.device("cpu")


def rank_device(devices: list[str] | None, rank: int) -> torch.device:
    """The device of ``rank``: the replica's ``rank``-th device (a single-device replica's rule: CPU
    unless devices are given and CUDA is there)."""
    return resolve_device([devices[rank]] if devices else None)


def backend_for(device: torch.device) -> str:
    # on GPUs, small CPU tensors (sizes, the plans' agreement) still go over gloo. On the CPU the name says
    # "cpu:" too: diffusers' Ulysses size exchange gathers on the CPU only when the backend names it, else on
    # torch.accelerator.current_accelerator(), which a CUDA-enabled torch reports as cuda even with no GPU
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "cpu:gloo"
