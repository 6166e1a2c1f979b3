"""The model and machine most planner tests plan on (frozen specs: shared by every module)."""

from __future__ import annotations

import pytest

from slide_ir.specs.hardware import load_machine
from slide_ir.specs.model_catalog import load_model


@pytest.fixture(scope="session")
def llama8b():
    return load_model("llama-3.1-8b")


@pytest.fixture(scope="session")
def pc():
    return load_machine("paper-pc-4090")
