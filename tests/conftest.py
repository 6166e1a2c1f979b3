"""Test-wide set-up.

Without CUDA, Triton kernels run in the interpreter: TRITON_INTERPRET must be set before anything
imports `slide_kernels` (triton reads it at decoration time), so it is set here, at collection start.
"""

import os

try:
    import torch

    _has_cuda = torch.cuda.is_available()
except ImportError:  # planning and simulating need no torch
    _has_cuda = False

if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs CUDA (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords and not _has_cuda:
            item.add_marker(skip_gpu)
