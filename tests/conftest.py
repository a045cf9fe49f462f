"""Shared fixtures: dtypes, devices, engines and the hypothesis CI profile."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# No deadlines anywhere: timing is for benchmarks, never for pass/fail.
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=30,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Triton kernels run in Triton's interpreter on CPU-only machines (set before triton is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
#: Every engine `to_cartesian` can dispatch to; every core test runs on each.
METHODS = ["levels", "scan", "auto"]


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    return request.param


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=METHODS)
def method(request: pytest.FixtureRequest) -> str:
    return request.param
