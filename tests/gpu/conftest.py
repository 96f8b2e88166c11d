"""GPU tests run on a CUDA host: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with Transformer Engine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
