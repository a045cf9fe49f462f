"""The blocked path scan (chains) and the compiled builder."""

from __future__ import annotations

import re

import pytest
import torch

import batched_nerf as bn
from batched_nerf import data
from batched_nerf.engines.compiled import FIXED_TORCH, _torch_version
from batched_nerf.engines.levels import build_levels
from batched_nerf.engines.scan.build import _narrow_runs, build_scan
from batched_nerf.engines.scan.path import Take, path_band, scan_path, trig_dtype


def _chain_inputs(n: int, batch: int, seed: int, dtype: torch.dtype = torch.float64):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    b = 1.3 + 0.3 * torch.rand(batch, n, generator=g, dtype=torch.float64)
    a = 1.6 + 0.6 * torch.rand(batch, n, generator=g, dtype=torch.float64)
    d = 6 * torch.rand(batch, n, generator=g, dtype=torch.float64) - 3
    return b.to(dtype), a.to(dtype), d.to(dtype)


@pytest.mark.parametrize("band", [1, 2, 3, 5, 8, 64])
def test_bands_agree_with_levels(band: int) -> None:
    """Any band length K (padding included) places a chain like the level engine."""
    n, batch = 41, 3
    table = bn.ConstructionTable.chain(n)
    b, a, d = _chain_inputs(n, batch, band)
    ref = build_levels(table.plan("levels"), b, a, d, None)
    # the path: atoms 2..N-1 below the anchor at atom 1 (rotation identity), third seed with dihedral 0
    p = torch.cat((torch.zeros(batch, 3, dtype=d.dtype), d[:, 3:]), dim=1)
    rtp = torch.stack((b[:, 2:], a[:, 2:], p[:, 2:])).transpose(1, 2)  # (3, D, M)
    pad = -rtp.shape[1] % band
    rtp = torch.cat((rtp, rtp.new_zeros((3, pad, batch))), dim=1)
    frame = torch.eye(3, dtype=b.dtype).unsqueeze(-1).expand(3, 3, batch)
    origin = torch.stack((b[:, 1], torch.zeros_like(b[:, 1]), torch.zeros_like(b[:, 1])))
    x = scan_path(rtp, frame, origin, band)[:, : n - 2]
    torch.testing.assert_close(x.permute(2, 1, 0), ref[:, 2:], atol=1e-11, rtol=0)


def test_chain_plan_is_gather_free() -> None:
    plan = bn.ConstructionTable.chain(100).plan("scan")
    assert plan.rounds[0].path is not None and plan.rounds[0].path.runs == ((2, 98),)
    assert not plan.gathers and plan.assemble.runs == ((0, 3), (6, 97))
    branched = data.load("alanine_dipeptide").table.plan("scan")
    assert branched.gathers and all(r.path is None for r in branched.rounds)


def test_band_and_trig_choice() -> None:
    assert path_band(4094, 1) <= 8 < path_band(4094, 256) <= 64
    assert path_band(4094, 256, compiled=True) <= 8  # compile time grows with the band, never with N
    assert trig_dtype(4094, 1, torch.float32) == torch.float64
    assert trig_dtype(4094, 256, torch.float32) == torch.float32
    assert trig_dtype(4094, 1, torch.float64) == torch.float64


def test_float32_chain_accuracy() -> None:
    """float32 single chains: local rotations rounded once from float64 (NeRFax: 4.4e-4 at 4,096)."""
    n = 4096
    table = bn.ConstructionTable.chain(n)
    b, a, d = _chain_inputs(n, 1, 9, torch.float32)
    ref = build_levels(table.plan("levels"), b.double(), a.double(), d.double(), None)
    err = (bn.to_cartesian(b, a, d, table, method="scan").double() - ref).abs().max().item()
    assert err < 4.4e-4


def test_large_batch_matches_float64() -> None:
    """Batches take the float32 trigonometry path and long bands; still agree with float64."""
    n, batch = 300, 256
    table = bn.ConstructionTable.chain(n)
    b, a, d = _chain_inputs(n, batch, 10, torch.float32)
    assert path_band(n - 2, batch) > 4
    ref = bn.to_cartesian(b.double(), a.double(), d.double(), table, method="levels")
    torch.testing.assert_close(
        bn.to_cartesian(b, a, d, table, method="scan").double(), ref, atol=2e-4, rtol=0
    )


def test_take_slices_and_gathers() -> None:
    x = torch.arange(20.0).reshape(2, 10)
    for index in ([3, 4, 5], [0, 1, 7, 8], [9, 2, 5, 1, 0, 6], list(range(10))):
        take = Take.of(index)
        torch.testing.assert_close(take(x, -1), x[:, index])
    assert Take.of([1, 2, 3, 7]).runs == ((1, 3), (7, 1)) and Take.of([5, 3, 1, 0, 8]).runs is None
    pieces = [torch.zeros(1, 2, 3), torch.ones(1, 4, 3), 2 * torch.ones(1, 1, 3)]
    got = torch.cat(_narrow_runs(pieces, ((1, 3), (5, 2))), dim=-2)
    torch.testing.assert_close(got, torch.cat(pieces, dim=-2)[:, [1, 2, 3, 5, 6]])


def test_gradgradcheck_path() -> None:
    table = bn.ConstructionTable.chain(9)
    b, a, d = (t.requires_grad_() for t in _chain_inputs(9, 2, 11))
    plan = table.plan("scan")
    assert plan.rounds[0].path is not None
    fn = lambda b, a, d: build_scan(plan, b, a, d, None)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (b, a, d))
    assert torch.autograd.gradgradcheck(fn, (b, a, d))


def test_compile_builder_errors() -> None:
    with pytest.raises(TypeError, match="table must be a ConstructionTable, got list"):
        bn.compile_builder([[-1, -1, -1]])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method must be one of"):
        bn.compile_builder(bn.ConstructionTable.chain(4), method="fast")


@pytest.mark.compile
def test_compiled_chain_forward_backward() -> None:
    """Compiled forward and first-order backward of a chain agree with eager (CPU, any torch)."""
    n = 24
    table = bn.ConstructionTable.chain(n)
    ic = _chain_inputs(n, 3, 12, torch.float32)
    w = torch.randn(3, n, 3, generator=torch.Generator().manual_seed(0))
    build = bn.compile_builder(table)
    outs = []
    for fn in (build, lambda b, a, d: bn.to_cartesian(b, a, d, table, method="scan")):
        leaves = [t.clone().requires_grad_() for t in ic]
        x = fn(*leaves)
        (x * w).sum().backward()
        outs.append([x.detach()] + [t.grad for t in leaves])
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.compile
def test_compiled_auto_fullgraph() -> None:
    """``method="auto"`` compiles with ``fullgraph=True``: dispatch reads only Python ints."""
    table = bn.ConstructionTable.chain(12)
    ic = _chain_inputs(12, 2, 13, torch.float32)
    build = bn.compile_builder(table, method="auto")
    with torch.no_grad():
        torch.testing.assert_close(build(*ic), bn.to_cartesian(*ic, table))


@pytest.mark.compile
@pytest.mark.skipif(_torch_version() >= FIXED_TORCH, reason="torch's CPU inductor scatter fix present")
def test_compiled_backward_refused_with_gathers() -> None:
    table = data.load("alanine_dipeptide").table
    ic = [t.requires_grad_() for t in _chain_inputs(22, 2, 14, torch.float32)]
    build = bn.compile_builder(table)
    with pytest.raises(
        RuntimeError, match=re.escape(f"not supported on the CPU with torch {torch.__version__}")
    ):
        build(*ic)
    with pytest.raises(Exception, match=re.escape(f"CPU with torch {torch.__version__}")):
        torch.compile(lambda b, a, d: bn.to_cartesian(b, a, d, table, method="scan"), fullgraph=True)(*ic)
