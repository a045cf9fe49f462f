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


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", ["a few runs", "many runs", "no entries"])
@pytest.mark.parametrize("threaded", [False, True])
def test_the_cpu_copies_give_the_torch_maps_bits(
    name: str, dtype: torch.dtype, threaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where numba is installed the plain CPU calls take the backend's copies (one pass over the rows,
    threaded above a size): the same bits as the torch maps, NaN included."""
    pytest.importorskip("numba")
    from batched_nerf.engines.fused.cpu import entries as cpu_entries
    from batched_nerf.learning import entries as module

    if threaded:
        monkeypatch.setattr(cpu_entries, "SERIAL_VALUES", 0)
        monkeypatch.setattr(cpu_entries, "WORKQUEUE_SERIAL_VALUES", 0)
    layout = _layout(name)
    gen = torch.Generator().manual_seed(2)
    values = torch.randn(3, 5, layout.n_atoms, dtype=F64, generator=gen).to(dtype)
    entries = torch.randn(3, 5, layout.atoms.numel(), dtype=F64, generator=gen).to(dtype)
    values[0, 1, -1], entries[..., :1] = float("nan"), float("nan")
    assert module._kernels(values) is not None
    got = gather(values, layout), spread(entries, layout), spread(entries[1, 2], layout)
    monkeypatch.setattr(module, "_kernels", lambda x: None)
    want = gather(values, layout), spread(entries, layout), spread(entries[1, 2], layout)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.view(torch.int8), w.view(torch.int8))  # bitwise, NaN included


def test_the_cpu_copies_serve_plain_calls_only() -> None:
    pytest.importorskip("numba")
    from batched_nerf.learning.entries import _kernels

    x = torch.ones(2, 3)
    assert _kernels(x) is not None
    assert _kernels(x.half()) is None  # no kernel for the dtype
    assert _kernels(x.clone().requires_grad_()) is None  # a gradient kept: the Function's route
    with torch.no_grad():
        assert _kernels(x.clone().requires_grad_()) is not None
    seen = []
    torch.func.vmap(lambda v: seen.append(_kernels(v)) or v)(x)
    assert seen == [None]  # under a transform: torch
