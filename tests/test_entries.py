"""The flow layer's entry layout: gather and spread are exact, adjoint, and differentiable to any order."""

from __future__ import annotations

import pytest
import torch

from batched_nerf.learning.entries import MAX_RUNS, EntryLayout, gather, spread

F64 = torch.float64

#: layouts of each kind the functions take apart: one run (a view), a few runs (a ``cat``),
#: more runs than are sliced (an index), none
LAYOUTS = {
    "one run": ([1, 2, 3, 4], 6),
    "a few runs": ([0, 2, 3, 5, 6, 7], 9),
    "many runs": (list(range(0, 2 * (MAX_RUNS + 2), 2)), 2 * (MAX_RUNS + 2) + 1),
    "no entries": ([], 4),
}


def _layout(name: str) -> EntryLayout:
    atoms, n = LAYOUTS[name]
    return EntryLayout.of(torch.tensor(atoms, dtype=torch.long), n)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gather_and_spread_are_the_index_and_its_adjoint(name: str) -> None:
    layout = _layout(name)
    assert (layout.runs is None) == (name == "many runs")
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(2, 3, layout.n_atoms, dtype=F64, generator=gen)
    entries = torch.randn(2, 3, layout.atoms.numel(), dtype=F64, generator=gen)
    torch.testing.assert_close(gather(values, layout), values[..., layout.atoms], rtol=0, atol=0)
    full = torch.zeros_like(values)
    full[..., layout.atoms] = entries
    torch.testing.assert_close(spread(entries, layout), full, rtol=0, atol=0)
    # adjoint: <gather(v), e> == <v, spread(e)>
    inner = (gather(values, layout) * entries).sum()
    torch.testing.assert_close(inner, (values * spread(entries, layout)).sum())


@pytest.mark.parametrize("name", ["one run", "a few runs", "many runs"])
def test_nan_stays_at_its_atom(name: str) -> None:
    layout = _layout(name)
    entries = torch.ones(layout.atoms.numel(), dtype=F64)
    entries[1] = float("nan")
    out = spread(entries, layout)
    assert out.isnan().nonzero().flatten().tolist() == [layout.atoms[1].item()]
    assert gather(out, layout).isnan().nonzero().flatten().tolist() == [1]


@pytest.mark.parametrize("name", ["one run", "a few runs", "many runs"])
def test_first_and_second_derivatives(name: str) -> None:
    layout = _layout(name)
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(2, layout.n_atoms, dtype=F64, generator=gen, requires_grad=True)
    entries = torch.randn(2, layout.atoms.numel(), dtype=F64, generator=gen, requires_grad=True)
    # nonlinear around the linear maps, so that second derivatives are not all zero
    assert torch.autograd.gradcheck(lambda v: gather(v, layout).sin(), (values,))
    assert torch.autograd.gradgradcheck(lambda v: gather(v, layout).sin(), (values,))
    assert torch.autograd.gradcheck(lambda e: spread(e, layout).sin(), (entries,))
    assert torch.autograd.gradgradcheck(lambda e: spread(e, layout).sin(), (entries,))
    # the backward of each is the other, itself differentiable (a double backward through it)
    (g,) = torch.autograd.grad(spread(entries, layout).pow(3).sum(), entries, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), entries)
    torch.testing.assert_close(gg, 6 * entries.detach())


@pytest.mark.parametrize("name", ["one run", "a few runs", "many runs"])
def test_torch_func(name: str) -> None:
    layout = _layout(name)
    gen = torch.Generator().manual_seed(2)
    values = torch.randn(4, layout.n_atoms, dtype=F64, generator=gen)
    entries = torch.randn(4, layout.atoms.numel(), dtype=F64, generator=gen)
    torch.testing.assert_close(torch.func.vmap(lambda e: spread(e, layout))(entries), spread(entries, layout))
    torch.testing.assert_close(torch.func.vmap(lambda v: gather(v, layout))(values), gather(values, layout))
    jac = torch.func.jacrev(lambda e: spread(e, layout))(entries[0])
    torch.testing.assert_close(torch.func.jacfwd(lambda e: spread(e, layout))(entries[0]), jac)
    eye = torch.eye(layout.n_atoms, dtype=F64)[:, layout.atoms]
    torch.testing.assert_close(jac, eye, rtol=0, atol=0)
    jac = torch.func.jacfwd(lambda v: gather(v, layout))(values[0])
    torch.testing.assert_close(torch.func.jacrev(lambda v: gather(v, layout))(values[0]), jac)
    torch.testing.assert_close(jac, eye.T, rtol=0, atol=0)
    hess = torch.func.hessian(lambda e: spread(e, layout).pow(3).sum())(entries[0])
    torch.testing.assert_close(hess, torch.diag(6 * entries[0]))
