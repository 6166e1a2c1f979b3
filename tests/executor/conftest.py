"""Executor tests run tiny models: one intra-op thread each. Several lane threads already
share the two CI cores, and OpenMP teams spinning against each other (or against another
process) make a 2 ms step take a second."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
