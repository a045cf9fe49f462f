"""The level engine's hand-written backward (``LevelLoop``) against plain autograd of the same loop."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import jacrev, vmap

import batched_nerf as bn
from batched_nerf.engines.levels import LevelLoop, level_loop, local_frames, plain_level_loop, seed_frames

F64 = torch.float64
TABLES = {
    "chain": bn.ConstructionTable.chain(7),
    "branched": bn.ConstructionTable(
        [[4, -1, -1], [4, 0, 2], [0, 4, -1], [4, 0, 1], [-1, -1, -1], [2, 0, 4]]
    ),  # shuffled, branched
    "fixed": bn.ConstructionTable(
        [[-1, -1, -1], [3, 0, 5], [1, 3, 0], [-1, -1, -1], [2, 1, 3], [-1, -1, -1]], fixed=[3, 0, 5]
    ),
    "alanine_dipeptide": bn.data.load("alanine_dipeptide").table,
}


def loop_inputs(
    name: str, batch: int = 3, seed: int = 0, straight: bool = False
) -> tuple[bn.ConstructionTable, tuple[torch.Tensor, ...]]:
    """Inputs of a table's level loop, float64: block 0 ``(n0, 3, B)``, third-seed frames
    ``(2 S3, 3, 3, B)``, local offsets ``(M, 3, B)`` and rotations ``(M, 3, 3, B)``."""
    table = TABLES[name]
    plan = table.plan("levels", torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    n0, m = plan.seeds.atoms.numel(), plan.full_atoms.numel()
    block0 = torch.randn(n0, 3, batch, generator=g, dtype=F64)
    r = 1.0 + 0.5 * torch.rand(m, batch, generator=g, dtype=F64)
    t = 0.6 + 1.9 * torch.rand(m, batch, generator=g, dtype=F64)
    if straight:
        t[::2] = math.pi  # collinear references for the atoms built on these
    p = math.pi * (2 * torch.rand(m, batch, generator=g, dtype=F64) - 1)
    t3 = 0.6 + 1.9 * torch.rand(plan.seeds.third.numel(), batch, generator=g, dtype=F64)
    return plan, (
        block0,
        seed_frames(plan, t3),
        *local_frames(r.unsqueeze(1), torch.stack((t, p), 1), plan.read_rows),
    )


def grads(fn, plan, inputs: tuple[torch.Tensor, ...], w: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    leaves = tuple(x.clone().requires_grad_() for x in inputs)
    out = fn(plan, *leaves)
    return (
        out.detach(),
        *torch.autograd.grad((out * w).sum(), leaves, allow_unused=True, materialize_grads=True),
    )


def fast_loop(plan, *inputs):  # type: ignore[no-untyped-def]
    return LevelLoop.apply(*inputs, plan)[0]


def _weights(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    block0, loc = inputs[0], inputs[2]
    return torch.randn(block0.shape[0] + loc.shape[0], 3, block0.shape[-1], dtype=F64)


@pytest.mark.parametrize("name", list(TABLES))
@pytest.mark.parametrize("straight", [False, True], ids=["generic", "straight"])
def test_backward_matches_plain_autograd(name: str, straight: bool) -> None:
    plan, inputs = loop_inputs(name, straight=straight)
    w = _weights(inputs)
    fast = grads(fast_loop, plan, inputs, w)
    plain = grads(plain_level_loop, plan, inputs, w)
    for f, p in zip(fast, plain):
        assert torch.isfinite(f).all()
        if not straight:
            # at straight angles the frame of the next atom is rounding noise (a 1e-15 change of
            # the inputs moves the plain gradients by O(1)): only finiteness is checked there
            torch.testing.assert_close(f, p, rtol=1e-10, atol=1e-10)


def test_backward_finite_for_coincident_atoms() -> None:
    plan, inputs = loop_inputs("fixed")
    inputs = (torch.zeros_like(inputs[0]), *inputs[1:])  # every fixed atom at the origin
    w = _weights(inputs)
    fast = grads(fast_loop, plan, inputs, w)
    plain = grads(plain_level_loop, plan, inputs, w)
    for f, p in zip(fast, plain):
        assert torch.isfinite(f).all()
        torch.testing.assert_close(f, p, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["branched", "fixed"])
def test_gradcheck_and_gradgradcheck(name: str) -> None:
    plan, inputs = loop_inputs(name, batch=2)
    inputs = tuple(x.requires_grad_() for x in inputs)
    fn = lambda *t: fast_loop(plan, *t)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_vmap_and_jacrev_of_the_function_agree_with_plain() -> None:
    plan, inputs = loop_inputs("branched", batch=2)
    fast = lambda *t: fast_loop(plan, *t)  # noqa: E731
    plain = lambda *t: plain_level_loop(plan, *t)  # noqa: E731
    block0 = inputs[0]
    stacked = (
        block0.expand(4, *block0.shape) + 0.1 * torch.arange(4.0, dtype=F64)[:, None, None, None],
        *inputs[1:],
    )
    dims = (0, None, None, None)
    torch.testing.assert_close(
        vmap(fast, in_dims=dims)(*stacked), vmap(plain, in_dims=dims)(*stacked), rtol=0, atol=1e-12
    )
    for argnum in range(4):
        torch.testing.assert_close(
            jacrev(fast, argnums=argnum)(*inputs), jacrev(plain, argnums=argnum)(*inputs)
        )


def test_to_cartesian_runs_the_hand_written_backward() -> None:
    table = TABLES["alanine_dipeptide"]
    ic = [torch.rand(2, table.n_atoms, dtype=F64).requires_grad_() for _ in range(3)]
    xyz = bn.to_cartesian(*ic, table, method="levels")
    seen, stack = set(), [xyz.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(fn for fn, _ in node.next_functions)
    assert any(type(node).__name__ == "LevelLoopBackward" for node in seen)
    # without gradients the plain loop runs (no frames kept)
    with torch.no_grad():
        plan, inputs = loop_inputs("chain")
        assert isinstance(level_loop(plan, *inputs), torch.Tensor)


# ---------------------------------------------------------- entry / exit layout maps
def _layout_cases():  # type: ignore[no-untyped-def]
    from batched_nerf.engines.layout import FromRows, FromXyz, SinCos, ToRows, ToXyz

    g = torch.Generator().manual_seed(3)
    rows = torch.tensor([4, 0, 2, 3])  # a subset of 5 atoms, shuffled
    inverse = torch.tensor([2, 0, 4, 1, 3])  # a permutation of 5 rows
    return {
        "to_rows": (lambda x: ToRows.apply(x, rows, 5), torch.randn(3, 2, 5, generator=g, dtype=F64)),
        "from_rows": (lambda x: FromRows.apply(x, rows, 5), torch.randn(4, 3, 2, generator=g, dtype=F64)),
        "to_xyz": (lambda x: ToXyz.apply(x, inverse, 5), torch.randn(5, 3, 2, generator=g, dtype=F64)),
        "from_xyz": (lambda x: FromXyz.apply(x, inverse, 5), torch.randn(2, 5, 3, generator=g, dtype=F64)),
        "sincos": (lambda x: SinCos.apply(x), torch.randn(4, 2, 3, generator=g, dtype=F64)),
    }


@pytest.mark.parametrize("name", ["to_rows", "from_rows", "to_xyz", "from_xyz", "sincos"])
def test_layout_maps_first_second_and_forward_derivatives(name: str) -> None:
    fn, x = _layout_cases()[name]
    x.requires_grad_()
    assert torch.autograd.gradcheck(fn, (x,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_layout_maps_are_the_plain_ops() -> None:
    cases = _layout_cases()
    fn, x = cases["to_rows"]
    torch.testing.assert_close(fn(x), x.permute(2, 0, 1).index_select(0, torch.tensor([4, 0, 2, 3])))
    fn, x = cases["to_xyz"]
    torch.testing.assert_close(fn(x), x.index_select(0, torch.tensor([2, 0, 4, 1, 3])).permute(2, 0, 1))
    fn, x = cases["sincos"]
    torch.testing.assert_close(fn(x), (x.cos(), x.sin()))
    # each adjoint is the transpose: <A x, y> == <x, A^T y>
    for forward, adjoint in (("to_rows", "from_rows"), ("to_xyz", "from_xyz")):
        (a, x), (at, y) = cases[forward], cases[adjoint]
        torch.testing.assert_close((a(x) * y).sum(), (x * at(y)).sum())
