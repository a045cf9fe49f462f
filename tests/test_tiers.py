"""Tiered compilation of the blocked CPU kernels (engines/fused/cpu/tiers.py): per-sample kernels
until a blocked kernel is cached or has become worth its compile, the same values either way."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import batched_nerf as bn

pytest.importorskip("numba", reason="the fused CPU kernels need numba")
from batched_nerf.engines import backends  # noqa: E402

backends.require("cpu")  # the kernels loaded as in use (their cache writes locked) before any is patched
from batched_nerf.engines.fused.cpu import blocks, inverse_blocks, tiers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BATCH = 64  # from BLOCK_MIN samples on the dispatch rule picks the blocked kernels
TABLE = bn.ConstructionTable.chain(12)
ITEMS = {"_blocks_items", "_blocks_backward_items", "vjp_items", "second_items"}


def _committor(table: bn.ConstructionTable) -> list[torch.Tensor]:
    """Builder forward + backward, then to_internal's vjp and second order: every blocked entry."""
    gen = torch.Generator().manual_seed(0)
    n = table.n_atoms
    b = (1.0 + 0.5 * torch.rand(BATCH, n, generator=gen, dtype=torch.float64)).requires_grad_()
    a = (1.7 + 0.6 * torch.rand(BATCH, n, generator=gen, dtype=torch.float64)).requires_grad_()
    d = (6.0 * torch.rand(BATCH, n, generator=gen, dtype=torch.float64) - 3.0).requires_grad_()
    xyz = bn.to_cartesian(b, a, d, table, method="fused")
    xyz.square().sum().backward()
    x = xyz.detach().requires_grad_()
    ic = bn.to_internal(x, table, method="fused")
    (g,) = torch.autograd.grad(ic.dihedrals.sin().sum() + ic.bonds.square().sum(), x, create_graph=True)
    g.square().sum().backward()
    return [xyz.detach(), b.grad, a.grad, d.grad, g.detach(), x.grad]


@pytest.fixture
def tiered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Tiering on, nothing cached, every blocked entry recording its calls (names)."""
    monkeypatch.setattr(tiers, "_always", False)
    monkeypatch.setattr(tiers, "_state", {})
    monkeypatch.setattr(tiers, "_cached", lambda kernel, args: False)
    calls: list[str] = []
    for module, name in (
        (blocks, "_blocks_items"),
        (blocks, "_blocks_parallel"),
        (blocks, "_blocks_backward_items"),
        (blocks, "_blocks_backward_parallel"),
        (inverse_blocks, "vjp_items"),
        (inverse_blocks, "vjp_parallel"),
        (inverse_blocks, "second_items"),
        (inverse_blocks, "second_parallel"),
    ):
        kernel = getattr(module, name)

        def record(*args, _kernel=kernel, _name=name):  # type: ignore[no-untyped-def]
            calls.append(_name)
            return _kernel(*args)

        record.py_func = kernel.py_func  # type: ignore[attr-defined]
        monkeypatch.setattr(module, name, record)
    return calls


def test_per_sample_kernels_serve_until_the_blocked_ones_pay_then_they_compile(
    tiered: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with tiers.always():
        want = _committor(TABLE)  # the blocked kernels (as without tiering)
    assert set(tiered) == ITEMS  # 64 x 12 atom-samples: every kernel on the calling thread
    tiered.clear()
    monkeypatch.setattr(tiers, "TIER_UP_SECONDS", 1e9)
    got = _committor(TABLE)
    assert tiered == []  # per-sample kernels only
    for g, w in zip(got, want):  # the same operations in the same order: the same bits
        assert torch.equal(_bits(g), _bits(w))
    spent = [v for v in tiers._state.values()]
    assert len(spent) == 4 and all(v is not True and v > 0 for v in spent)  # charged per entry
    layouts = bn.backends()["layouts"]  # what such a call runs now, said
    assert len(layouts) == 4 and all(v.startswith("per sample (") for v in layouts.values())
    assert "vjp_items (float64)" in layouts
    monkeypatch.setattr(tiers, "TIER_UP_SECONDS", 0.0)
    caplog.set_level(logging.WARNING, logger="batched_nerf")
    got = _committor(TABLE)
    assert set(tiered) == ITEMS and all(v is True for v in tiers._state.values())
    assert set(bn.backends()["layouts"].values()) == {"blocked"}
    messages = [r.getMessage() for r in caplog.records if "blocked kernel" in r.getMessage()]
    assert len(messages) == 4 and "compiling it (float64" in messages[0] and "warmup" in messages[0]
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The bit patterns of ``x`` (NaNs and signed zeros compared too)."""
    return x.detach().contiguous().view(torch.int32 if x.dtype == torch.float32 else torch.int64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("singular", [False, True])
def test_both_layouts_give_the_same_bits(
    tiered: list[str], monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, singular: bool
) -> None:
    """Per-sample and blocked kernels, forward, backward, the inverse's vjp and second order, on a
    branched molecule with hydrogens (every row kind), at ordinary and at collinear geometry."""
    table = bn.protein.protein_table("ACE ALA NME", hydrogens=True).table
    gen = torch.Generator().manual_seed(1)
    n = table.n_atoms
    xyz = 2.0 * torch.randn(BATCH, n, 3, generator=gen, dtype=dtype)
    if singular:  # an angle of pi and a zero-length bond
        xyz[:, 6] = 2 * xyz[:, 5] - xyz[:, 4]
        xyz[:, 8] = xyz[:, 7]

    def run() -> list[torch.Tensor]:
        x = xyz.clone().requires_grad_()
        ic = bn.to_internal(x, table, method="fused")
        loss = ic.dihedrals.sin().sum() + ic.bonds.square().sum() + ic.angles.cos().sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        g.square().sum().backward()
        return [ic.bonds, ic.angles, ic.dihedrals, g.detach(), x.grad]

    with tiers.always():
        blocked = run()
    assert {"vjp_items", "second_items"} <= set(tiered)
    tiered.clear()
    monkeypatch.setattr(tiers, "TIER_UP_SECONDS", 1e9)
    per_sample = run()
    assert tiered == []
    for got, want in zip(per_sample, blocked):
        assert torch.equal(_bits(got), _bits(want))


_COLD_WARM = """
import sys, torch, batched_nerf as bn
from batched_nerf.engines.fused.cpu import tiers
tiers.TIER_UP_SECONDS = 1e9  # no tier-up by time: only the disk cache or `always` decide
table = bn.ConstructionTable.chain(12)
def second():
    x = (2.0 * torch.randn(64, 12, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    x.requires_grad_()
    ic = bn.to_internal(x, table, method="fused")
    (g,) = torch.autograd.grad(ic.dihedrals.sin().sum() + ic.bonds.square().sum(), x, create_graph=True)
    g.square().sum().backward()
    return torch.stack([g.detach(), x.grad])
first = second()
blocked = sorted(v is True for v in tiers._state.values())
with tiers.always():
    tiered_up = second()
torch.save({"first": first, "blocked": blocked, "tiered_up": tiered_up}, sys.argv[1])
"""


def test_results_do_not_depend_on_the_kernel_cache_or_a_tier_up(tmp_path: Path) -> None:
    """The same calls on an empty numba cache (per-sample kernels), after a tier-up in that process
    (blocked kernels, compiled then) and in a second process on the now warm cache (blocked, loaded):
    the same bits."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    env.pop("BATCHED_NERF_TIERED", None)
    runs = []
    for k in range(2):
        out = tmp_path / f"run{k}.pt"
        done = subprocess.run(
            [sys.executable, "-c", _COLD_WARM, str(out)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        runs.append(torch.load(out))
    cold, warm = runs
    assert cold["blocked"] == [False, False] and warm["blocked"] == [True, True]  # vjp and second order
    assert torch.equal(_bits(cold["first"]), _bits(cold["tiered_up"]))
    assert torch.equal(_bits(cold["first"]), _bits(warm["first"]))
    assert torch.equal(_bits(warm["first"]), _bits(warm["tiered_up"]))


def test_a_compiled_or_cached_blocked_kernel_runs_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with tiers.always():
        _committor(TABLE)  # compiled in this process now
    monkeypatch.setattr(tiers, "_always", False)
    monkeypatch.setattr(tiers, "_state", {})
    monkeypatch.setattr(tiers, "TIER_UP_SECONDS", 1e9)
    _committor(TABLE)
    assert len(tiers._state) == 4 and all(v is True for v in tiers._state.values())
    kernel = next(iter(tiers._state))[0]
    assert len(kernel.overloads) >= 1


_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import probed
from batched_nerf.engines.fused.cpu import tiers
if sys.argv[2] == "compile":
    probed.f(1.0)
else:
    print(tiers._cached(probed.f, (1.0,)), tiers._cached(probed.f, (1,)), len(probed.f.overloads))
"""


def test_cache_probe_reads_numba_disk_cache_without_compiling(tmp_path: Path) -> None:
    """A kernel compiled by an earlier process is found on disk (not compiled, not loaded); another
    signature of it, or a kernel without a disk cache, is not."""
    source = "import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n"
    (tmp_path / "probed.py").write_text(source)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    run = [sys.executable, "-c", _PROBE, str(tmp_path)]
    first = subprocess.run([*run, "compile"], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([*run, "probe"], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["True", "False", "0"]
    numba = pytest.importorskip("numba")
    uncached = numba.njit(lambda x: x)
    assert tiers._cached(uncached, (1.0,)) is False and uncached.overloads == {}
    uncached(1.0)
    assert tiers._cached(uncached, (1.0,)) is True  # compiled in this process


def test_warmup_compiles_the_blocked_kernels_whatever_the_tier(
    tiered: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiers, "TIER_UP_SECONDS", 1e9)
    _committor(TABLE)  # waiting for their tier: charged, per sample
    assert tiered == [] and len(tiers._state) == 4
    bn.warmup(dtypes=("float64",), passes=("forward",), threaded=False, progress=False)
    assert tiers._state == {}  # asked again at the next call (then compiled: found in memory)
    assert "_blocks_items" in tiered  # the blocked forward ran, although nothing is "cached" here


@pytest.mark.parametrize(
    ("value", "always"),
    [
        ("0", True),
        ("off", True),
        ("Disabled", True),
        ("1", False),
        ("enabled", False),
        ("", False),
        (None, False),
    ],
)
def test_environment_switch(value: str | None, always: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "BATCHED_NERF_TIERED"}
    if value is not None:
        env["BATCHED_NERF_TIERED"] = value
    code = "import batched_nerf as bn; from batched_nerf.engines.fused.cpu import tiers; "
    code += "print(tiers._always, bn.backends()['tiered'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(always), str(not always)]


@pytest.mark.parametrize("value", ["maybe", "2", "disable"])
def test_environment_switch_names_an_unknown_value(value: str) -> None:
    """An unknown value is named with the allowed ones, not silently taken as "on"."""
    with pytest.raises(
        ValueError, match=rf"BATCHED_NERF_TIERED='{value}' is not understood: use one of 1, true"
    ):
        tiers._tiering_off(value)
    env = dict(os.environ, BATCHED_NERF_TIERED=value, PYTHONPATH=str(ROOT))
    code = "import batched_nerf as bn; bn.backends()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "BATCHED_NERF_TIERED" in out.stderr and "disabled" in out.stderr
