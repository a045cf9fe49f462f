"""protein.build's bound path (engines.fused.torsions): the fused CPU kernels with no per-call checks.

Every test compares with the scan engine (``method="scan"``, which never takes
the bound path) and checks which path ran from the graph's node names.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import batched_nerf as bn
from batched_nerf.engines.backends import available
from batched_nerf.engines.fused import torsions
from batched_nerf.engines.fused.torsions import SMALL_VALUES, TorsionBuild
from batched_nerf.runtime import state

pytestmark = pytest.mark.skipif(not available("cpu"), reason="the bound path needs numba")

SEQ = "ACDEFGHIKW"
LAYOUTS = [(True, True), (False, True), (True, False), (False, False)]


def _torsions(shape, dtype=torch.float64, seed=0, omega=True, chi=True):
    g = torch.Generator().manual_seed(seed)
    n = len(SEQ)
    phi, psi, om = (torch.rand(*shape, n, generator=g, dtype=dtype) * 6 - 3 for _ in range(3))
    ch = torch.rand(*shape, n, 4, generator=g, dtype=dtype) * 6 - 3
    return [phi, psi, om if omega else None, ch if chi else None]


def _names(t: torch.Tensor) -> set[str]:
    """Node names of ``t``'s graph."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return {type(f).__name__ for f in seen}


@pytest.mark.parametrize("omega, chi", LAYOUTS)
@pytest.mark.parametrize("shape", [(), (3,), (2, 17), (800,)])  # (800,): the torch gather (SMALL_VALUES)
def test_values_and_gradients_match_the_scan_engine(shape, omega, chi):
    args = [a.requires_grad_(True) if a is not None else None for a in _torsions(shape, omega=omega, chi=chi)]
    given = [a for a in args if a is not None]
    fast = bn.protein.build(SEQ, *args).xyz
    ref = bn.protein.build(SEQ, *args, method="scan").xyz
    assert "TorsionFnBackward" in _names(fast)
    n = bn.protein.protein_table(SEQ).n_atoms
    assert fast.shape == ref.shape == (*shape, n, 3)
    assert (math.prod(shape) * n > SMALL_VALUES) == (shape == (800,))
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    w = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad((fast * w).sum(), given), torch.autograd.grad((ref * w).sum(), given)
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_float32_without_gradients_degrees_and_hydrogens():
    degrees = [a * 50 for a in _torsions((4,), dtype=torch.float32)]
    for hydrogens in (False, True):
        with torch.no_grad():
            fast = bn.protein.build(SEQ, *degrees, degrees=True, hydrogens=hydrogens)
        ref = bn.protein.build(SEQ, *degrees, degrees=True, hydrogens=hydrogens, method="scan")
        assert fast.xyz.dtype == torch.float32
        torch.testing.assert_close(fast.xyz, ref.xyz, rtol=0, atol=2e-4)


def test_second_order():
    phi, psi, _, chi = (
        a.requires_grad_(True) if a is not None else None for a in _torsions((2,), omega=False)
    )

    def f(a, b, c):
        return bn.protein.build("ACDW", a[..., :4], b[..., :4], None, c[..., :4, :]).xyz

    assert torch.autograd.gradcheck(f, (phi, psi, chi))
    assert torch.autograd.gradgradcheck(f, (phi, psi, chi))


def test_create_graph_loss_matches_the_scan_engine():
    def loss(method):
        phi, psi, omega, chi = (a.requires_grad_(True) for a in _torsions((3,)))
        xyz = bn.protein.build(SEQ, phi, psi, omega, chi, method=method).xyz
        (g,) = torch.autograd.grad((xyz * xyz.detach().sin()).sum(), phi, create_graph=True)
        (g.square().sum()).backward()
        return g.detach(), phi.grad, psi.grad, chi.grad

    for a, b in zip(loss("auto"), loss("scan")):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8)


def test_transforms_take_the_general_path():
    phi, psi, omega, chi = _torsions((3,))

    def f(a):
        return bn.protein.build(SEQ, a, psi[0], omega[0], chi[0]).xyz

    def f_scan(a):
        return bn.protein.build(SEQ, a, psi[0], omega[0], chi[0], method="scan").xyz

    torch.testing.assert_close(torch.func.vmap(f)(phi), torch.func.vmap(f_scan)(phi), rtol=0, atol=1e-10)
    torch.testing.assert_close(
        torch.func.jacrev(f)(phi[0]), torch.func.jacfwd(f_scan)(phi[0]), rtol=0, atol=1e-9
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"method": "levels"}, {"accumulate_dtype": torch.float64}, {"rotors": None, "geometry": "template"}],
)
def test_other_calls_take_the_general_path(kwargs):
    phi, psi, omega, chi = (a.requires_grad_(True) for a in _torsions(()))
    if kwargs.get("geometry") == "template":
        t = bn.protein.protein_table(SEQ)
        kwargs = {"geometry": (t.bonds, t.angles, t.dihedrals)}
    xyz = bn.protein.build(SEQ, phi, psi, omega, chi, **kwargs).xyz
    assert "TorsionFnBackward" not in _names(xyz)
    torch.testing.assert_close(
        xyz, bn.protein.build(SEQ, phi, psi, omega, chi, method="scan").xyz, atol=1e-9, rtol=0
    )


def test_first_use_under_inference_mode_then_training():
    seq = "MKVLA"
    phi, psi = torch.zeros(5), torch.full((5,), -0.8)
    with torch.inference_mode():
        bn.protein.build(seq, phi, psi)
    leaf = phi.clone().requires_grad_(True)
    bn.protein.build(seq, leaf, psi).xyz.sum().backward()
    assert torch.isfinite(leaf.grad).all() and leaf.grad.abs().sum() > 0


def test_nan_in_gives_nan_out():
    phi, psi, omega, chi = _torsions(())
    psi = psi.clone()
    psi[3] = float("nan")
    xyz = bn.protein.build(SEQ, phi, psi, omega, chi).xyz
    ref = bn.protein.build(SEQ, phi, psi, omega, chi, method="scan").xyz
    assert torch.isnan(xyz).any()
    assert torch.equal(torch.isnan(xyz), torch.isnan(ref))


def test_kept_arrays_are_bounded():
    """Many batch sizes keep at most the one byte budget of broadcast arrays, the least recently used
    dropped first; a call needing more than a quarter of it keeps nothing."""
    n = bn.protein.protein_table(SEQ).n_atoms
    unit = 3 * 4 * n  # float32 bonds, angles and template of one sample
    state.release_pools()
    old = bn.cache_budget(160 * unit)
    try:
        for m in (10, 20, 30, 40, 50, 35, 38):
            bn.protein.build(SEQ, *_torsions((m,), dtype=torch.float32))
            assert torsions.kept_bytes() <= 160 * unit
        kept = sorted(key[3] for key in state._idle if key[0] == torsions.POOL)
        assert kept == [30, 35, 38, 40]  # 50: over a quarter
        assert torsions.kept_bytes() == (30 + 35 + 38 + 40) * unit
    finally:
        bn.cache_budget(old)


def test_bad_sources_raise():
    plan = bn.ConstructionTable.chain(3).plan("fused")
    x = np.zeros(3)
    with pytest.raises(ValueError, match="a template row must read its own template value"):
        TorsionBuild(plan, x, x, x, np.array([1, 1, 3]), 1)
    with pytest.raises(ValueError, match="each value may be read by one row at most"):
        TorsionBuild(plan, x, x, x, np.array([0, 3, 3]), 1)


MIXED = ["ACDW", "GK", "MKVLAE"]


def _mixed(shape, omega=True, chi=True, pad=0):
    g = torch.Generator().manual_seed(1)
    n = max(len(s) for s in MIXED) + pad
    phi, psi, om = (
        torch.rand(*shape, len(MIXED), n, generator=g, dtype=torch.float64) * 6 - 3 for _ in range(3)
    )
    ch = torch.rand(*shape, len(MIXED), n, 4, generator=g, dtype=torch.float64) * 6 - 3
    return [phi, psi, om if omega else None, ch if chi else None]


@pytest.mark.parametrize("omega, chi", LAYOUTS)
@pytest.mark.parametrize("shape", [(), (5,)])
def test_mixed_batch_writes_the_padded_layout(shape, omega, chi):
    args = [a.requires_grad_(True) if a is not None else None for a in _mixed(shape, omega, chi)]
    given = [a for a in args if a is not None]
    fast = bn.protein.build_batch(MIXED, *args)
    ref = bn.protein.build_batch(MIXED, *args, method="scan")
    assert "TorsionFnBackward" in _names(fast.xyz)
    torch.testing.assert_close(fast.xyz, ref.xyz, rtol=0, atol=1e-10)
    assert (fast.xyz[..., ~fast.mask, :] == 0).all() and torch.equal(fast.mask, ref.mask)
    w = torch.randn_like(ref.xyz)
    fast_grads = torch.autograd.grad((fast.xyz * w).sum(), given)
    for a, b in zip(fast_grads, torch.autograd.grad((ref.xyz * w).sum(), given)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_mixed_batch_second_order_and_wider_padding():
    phi, psi, _, chi = (a.requires_grad_(True) if a is not None else None for a in _mixed((), omega=False))

    def f(a, b, c):
        return bn.protein.build_batch(MIXED, a, b, None, c).xyz

    assert "TorsionFnBackward" in _names(f(phi, psi, chi))
    assert torch.autograd.gradgradcheck(f, (phi, psi, chi))


@pytest.mark.parametrize("omega, chi", LAYOUTS)
def test_mixed_batch_padded_past_the_longest_sequence(omega, chi):
    """Torsions padded to L_pad > L_max (a data set's fixed length) take the bound build of that
    L_pad; the padding gets zero gradient."""
    wide = [a.requires_grad_(True) if a is not None else None for a in _mixed((2,), omega, chi, pad=3)]
    given = [a for a in wide if a is not None]
    fast = bn.protein.build_batch(MIXED, *wide).xyz
    ref = bn.protein.build_batch(MIXED, *wide, method="scan").xyz
    assert "TorsionFnBackward" in _names(fast)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-10)
    w = torch.randn_like(ref)
    for a, b in zip(
        torch.autograd.grad((fast * w).sum(), given), torch.autograd.grad((ref * w).sum(), given)
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
        assert (a[..., max(len(s) for s in MIXED) :] == 0).all()
    narrow = [None if a is None else a[..., :-4, :] if a.ndim == 4 else a[..., :-4] for a in wide]
    with pytest.raises(ValueError, match="L_max"):  # L_pad < L_max: the checked path raises
        bn.protein.build_batch(MIXED, *narrow)


def test_mixed_batch_binds_on_its_first_call():
    """A new combination of sequences (every step of a shuffled epoch) takes the bound build at once."""
    seqs = ["WY", "ACDEF", "GG"]
    phi = torch.zeros(3, 5, requires_grad=True)
    first, second = (bn.protein.build_batch(seqs, phi, phi).xyz for _ in range(2))
    assert "TorsionFnBackward" in _names(first)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_composed_packed_build_equals_the_packed_tables_own():
    """The bound build of a combination, assembled from the sequences' plans (compose_padded), is the
    build of the packed table array for array; its own plan is made only for a create_graph backward."""
    from batched_nerf.engines.fused.build import configure
    from batched_nerf.protein._build import _packed_build, packed_proteins

    packed = packed_proteins(["ACDW", "GKHH", "MKVLAE", "P"], hydrogens=True)
    fast = _packed_build(packed)
    assert "plan" not in vars(fast) and "atoms" not in vars(fast)
    plan = configure(packed.table.plan("fused", torch.device("cpu")), None, True)
    values = (x.numpy().astype(np.float64) for x in (packed.bonds, packed.angles, packed.dihedrals))
    n_out = len(packed.tables) * packed.n_max
    ref = TorsionBuild(plan, *values, packed.source.numpy(), fast.n_values, packed.unpad.numpy(), n_out)
    for name in ("rows", "slots", "out_rows", "pad", "atoms"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)
    for name in ("index", "starts"):
        np.testing.assert_array_equal(getattr(fast.kernel_plan, name), getattr(ref.kernel_plan, name))
    assert (fast.kernel_plan.width, fast.kernel_plan.fallback) == (ref.kernel_plan.width, True)
    for k in ("bonds", "angles", "template"):
        np.testing.assert_array_equal(fast._values[k], ref._values[k])
        np.testing.assert_array_equal(fast._table[k], ref._table[k])
    assert (fast.n_atoms, fast.n_out) == (ref.n_atoms, ref.n_out)
    assert fast.plan is plan
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = fast.nothing


def test_packed_build_is_freed_with_its_combination():
    """No reference cycle keeps a combination's arrays alive past its cache entry (its memory is reused
    at once, not after a garbage collection)."""
    import gc
    import weakref

    from batched_nerf.protein import _build
    from batched_nerf.runtime.state import state_of

    phi = torch.zeros(3, 2, 6)
    bn.protein.build_batch(["ACW", "GKVLAE"], phi, phi)
    packed = _build.packed_proteins(["ACW", "GKVLAE"])
    alive = weakref.ref(state_of(packed).memo["bound"][("build", 6)])
    del packed
    gc.disable()
    try:
        _build._packed.cache_clear()
        _build._packed_strings.cache_clear()
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("omega, chi", LAYOUTS)
def test_mixed_batch_in_degrees_keeps_the_defaults_in_radians(omega, chi):
    args = [None if a is None else a * 40 for a in _mixed((2,), omega, chi)]
    fast = bn.protein.build_batch(MIXED, *args, degrees=True)  # the bound path
    ref = bn.protein.build_batch(MIXED, *args, degrees=True, method="scan")
    torch.testing.assert_close(fast.xyz, ref.xyz, rtol=0, atol=1e-10)
