"""Shared fixtures: dtypes, devices, engines and the hypothesis CI profile."""

from __future__ import annotations

import importlib.util
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

# The blocked CPU kernels run wherever the dispatch rule picks them, compiled on first use (no
# tiered compilation, engines/fused/cpu/tiers.py): the tests of those kernels must run them on a
# cold cache too; tests/test_tiers.py turns tiering on where it tests it.
os.environ.setdefault("BATCHED_NERF_TIERED", "0")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
#: Every engine `to_cartesian` can dispatch to; every core test runs on each.
#: (``fused`` where numba is installed: ``pip install -e ".[test]"`` brings it; tests/test_fused.py
#: says so when it is absent)
METHODS = ["levels", "scan", *(["fused"] if importlib.util.find_spec("numba") else []), "auto"]


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    return request.param


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(params=METHODS)
def method(request: pytest.FixtureRequest) -> str:
    return request.param


#: ``torch.compile(fullgraph=True)`` of ``to_cartesian`` is tested from this torch release on (2.13.0 and
#: 2.14.1 are); torch 2.3 and 2.4, which the package still supports eagerly, cannot trace it (dynamo:
#: ``next(generator, default)``, ``Tensor.is_complex()``, ``math.log2`` of a size, ``str.split`` of
#: ``torch.__version__``), so tests marked ``compile`` skip there with this reason.
COMPILE_TESTED_FROM = (2, 13)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if release >= COMPILE_TESTED_FROM:
        return
    tested = ".".join(map(str, COMPILE_TESTED_FROM))
    skip = pytest.mark.skip(
        reason=f"torch.compile of the builder is tested on torch >= {tested} only "
        f"(2.3 and 2.4 cannot trace it); this is torch {torch.__version__}"
    )
    for item in items:
        if "compile" in item.keywords:
            item.add_marker(skip)
