"""GPU readiness without a GPU: the dispatch rule on CUDA, fallback after a Triton kernel error,
float32 accumulation, one lane per thread, and the compile check of .ci/triton_compile.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import batched_nerf as bn
from batched_nerf.engines import backends, dispatch, gpu_policy
from batched_nerf.engines.fused import build as fused
from batched_nerf.engines.gpu_policy import FUSED_MAX_COMPONENT, FUSED_MIN_LANES, KernelError

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64


# ------------------------------------------------------------------ the rule
@pytest.mark.parametrize(
    ("n_samples", "n_components", "largest", "want"),
    [
        (FUSED_MIN_LANES, 1, 22, "fused"),  # alanine dipeptide x 4,096: the lanes fill the device
        (FUSED_MIN_LANES - 1, 1, 22, "levels"),  # one lane short: the rule without fused kernels
        (41, 100, 22, "fused"),  # 100 packed molecules x 41 samples = 4,100 lanes
        (40, 100, 22, "levels"),  # 4,000 lanes
        (65_536, 1, FUSED_MAX_COMPONENT, "fused"),
        (65_536, 1, FUSED_MAX_COMPONENT + 1, "levels"),  # a long walk: never, however many lanes
        (1, 1, 1_392, "levels"),  # one protein, one sample
    ],
)
def test_cuda_rule_reads_lanes_and_largest_component(
    n_samples: int, n_components: int, largest: int, want: str
) -> None:
    shallow = dispatch.choose_method(
        6, False, n_samples, "cuda", True, n_components=n_components, largest_component=largest
    )
    assert shallow == want
    deep = dispatch.choose_method(
        600, False, n_samples, "cuda", True, n_components=n_components, largest_component=largest
    )
    assert deep == ("fused" if want == "fused" else "scan")  # deep tables take the scan engine
    # no fused backend on CUDA: the same inputs never give "fused"
    assert dispatch.choose_method(600, False, n_samples, "cuda", False, n_components=n_components) == "scan"


def test_fused_fills_device_is_the_threshold_pair() -> None:
    assert gpu_policy.fused_fills_device(FUSED_MIN_LANES, FUSED_MAX_COMPONENT)
    assert not gpu_policy.fused_fills_device(FUSED_MIN_LANES - 1, 1)
    assert not gpu_policy.fused_fills_device(10**9, FUSED_MAX_COMPONENT + 1)


def test_cpu_rule_unchanged_by_the_gpu_inputs() -> None:
    """On the CPU the fused engine goes first at every shape (numba), whatever lanes and sizes."""
    for lanes, largest in ((1, 100_000), (1, 22), (10**6, 22)):
        got = dispatch.choose_method(509, True, lanes, "cpu", True, n_components=1, largest_component=largest)
        assert got == "fused"


def test_auto_method_reads_the_tables_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "auto_may_use", lambda device: True)
    alanine = bn.data.load("alanine_dipeptide").table
    assert alanine.largest_component == 22 and alanine.n_components == 1
    assert dispatch.auto_method(alanine, FUSED_MIN_LANES, "cuda") == "fused"
    assert dispatch.auto_method(alanine, FUSED_MIN_LANES - 1, "cuda") == "levels"
    packed = bn.pack_tables([alanine] * 100)
    assert packed.largest_component == 22 and packed.n_components == 100
    assert dispatch.auto_method(packed, 41, "cuda") == "fused"
    long = bn.ConstructionTable.chain(FUSED_MAX_COMPONENT + 1)
    assert dispatch.auto_method(long, 10**5, "cuda") == "scan"
    assert dispatch.auto_method(alanine, 10**5, "cuda", compiled=True) == "levels"  # never under compile
    monkeypatch.setattr(backends, "auto_may_use", lambda device: False)  # triton absent or failed
    assert dispatch.auto_method(alanine, 10**5, "cuda") == "levels"


def test_largest_component_of_tables() -> None:
    assert bn.ConstructionTable.chain(7).largest_component == 7
    packed = bn.pack_tables([bn.ConstructionTable.chain(3), bn.data.load("benzene").table])
    assert packed.largest_component == max(3, bn.data.load("benzene").table.n_atoms)
    import pickle

    assert pickle.loads(pickle.dumps(packed)).largest_component == packed.largest_component


def test_backends_states_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_policy, "_disabled", {})
    info = bn.backends()
    assert str(FUSED_MIN_LANES) in info["rule"]["cuda"] and str(FUSED_MAX_COMPONENT) in info["rule"]["cuda"]
    assert "numba" in info["rule"]["cpu"]
    assert info["disabled"] == {}
    gpu_policy._disabled["cuda"] = "Triton kernel _build_kernel failed: X"
    info = bn.backends()
    assert info["disabled"] == {"cuda": "Triton kernel _build_kernel failed: X"}
    assert info["auto"]["cuda"] is False
    assert not backends.auto_may_use("cuda")


def test_one_lane_per_thread() -> None:
    pytest.importorskip("triton", reason="the Triton kernel modules need triton")
    from batched_nerf.engines.fused.cuda import build as fused_triton
    from batched_nerf.engines.fused.cuda import inverse as fused_inverse_triton

    assert fused_triton.BLOCK == 32 * fused_triton.NUM_WARPS
    assert fused_inverse_triton.BLOCK == 32 * fused_inverse_triton.NUM_WARPS


# ------------------------------------------------------------------ failures under auto
@pytest.fixture
def triton_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors of the fused engines run the Triton kernels (interpreter); no failure recorded yet."""
    pytest.importorskip("triton", minversion="3.0", reason="the Triton kernels need triton >= 3")
    from batched_nerf.engines.fused import inverse as fused_inverse
    from batched_nerf.engines.fused.cuda import build as fused_triton

    monkeypatch.setitem(backends._kernels, "cpu", fused_triton)
    monkeypatch.setattr(fused_inverse, "TRITON_ON_CPU", True)
    monkeypatch.setattr(gpu_policy, "_disabled", {})


class _Broken:
    """Stands for a JIT kernel whose compile fails: ``kernel[grid](...)`` raises."""

    def __getitem__(self, grid: object):
        def run(*args: object, **kwargs: object) -> None:
            raise RuntimeError("PTXAS error: Entry function uses too much shared data\nsecond line")

        return run


def _inputs(table: bn.ConstructionTable, batch: int = 2, dtype: torch.dtype = F64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = table.n_atoms
    return [
        torch.rand(batch, n, generator=g, dtype=dtype) + 0.8,
        torch.rand(batch, n, generator=g, dtype=dtype) * 2.0 + 0.5,
        (torch.rand(batch, n, generator=g, dtype=dtype) * 2.0 - 1.0) * math.pi,
    ]


def test_build_kernel_error_falls_back_under_auto_and_raises_for_fused(
    triton_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batched_nerf.engines.fused.cuda import build as fused_triton

    monkeypatch.setattr(fused_triton, "_build_kernel", _Broken())
    table = bn.data.load("alanine_dipeptide").table
    ic = [t.requires_grad_() for t in _inputs(table)]
    with pytest.raises(KernelError, match=r"Triton kernel _build_kernel failed: RuntimeError: PTXAS error"):
        bn.to_cartesian(*ic, table, method="fused")
    assert gpu_policy.disabled("cpu") is None  # method="fused" disables nothing
    want = bn.to_cartesian(*ic, table, method="levels")
    with pytest.warns(RuntimeWarning, match=r"method='auto': Triton kernel _build_kernel failed: .*PTXAS"):
        got = bn.to_cartesian(*ic, table)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    cot = torch.randn(want.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(torch.autograd.grad(got, ic, cot), torch.autograd.grad(want, ic, cot))
    assert "_build_kernel" in bn.backends()["disabled"]["cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once only
        again = bn.to_cartesian(*(t.detach() for t in ic), table)
    torch.testing.assert_close(again, want.detach(), atol=1e-12, rtol=0)


def test_vjp_kernel_error_falls_back_in_the_backward(
    triton_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward kernel runs; the backward's kernel fails: the gradient comes from the reference."""
    from batched_nerf.engines.fused.cuda import build as fused_triton

    monkeypatch.setattr(fused_triton, "_vjp_kernel", _Broken())
    table = bn.ConstructionTable.chain(6)
    ic = [t.requires_grad_() for t in _inputs(table)]
    want = bn.to_cartesian(*ic, table, method="levels")
    got = bn.to_cartesian(*ic, table)  # auto: the Triton forward kernel
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    with pytest.warns(RuntimeWarning, match=r"Triton kernel _vjp_kernel failed"):
        grads = torch.autograd.grad(got.square().sum(), ic)
    torch.testing.assert_close(grads, torch.autograd.grad(want.square().sum(), ic), atol=1e-10, rtol=1e-10)
    with pytest.raises(KernelError, match="_vjp_kernel"):
        torch.autograd.grad(bn.to_cartesian(*ic, table, method="fused").sum(), ic)


def test_inverse_kernel_error_falls_back_under_auto(
    triton_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batched_nerf.engines.fused.cuda import inverse as fused_inverse_triton

    monkeypatch.setattr(fused_inverse_triton, "_forward_kernel", _Broken())
    table = bn.data.load("alanine_dipeptide").table
    x = bn.to_cartesian(*_inputs(table), table, method="levels").requires_grad_()
    with pytest.raises(KernelError, match=r"_forward_kernel failed: RuntimeError: PTXAS"):
        bn.to_internal(x, table, method="fused")
    want = bn.to_internal(x, table, method="torch")
    with pytest.warns(RuntimeWarning, match=r"_forward_kernel failed"):
        got = bn.to_internal(x, table)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
    (g_got,) = torch.autograd.grad(sum(c.sum() for c in got), x)
    (g_want,) = torch.autograd.grad(sum(c.sum() for c in want), x)
    torch.testing.assert_close(g_got, g_want, atol=1e-10, rtol=1e-10)


def test_launch_names_the_kernel_and_chains_the_error() -> None:
    want = r"^Triton kernel k failed: RuntimeError: PTXAS error: .*data$"  # the first line only
    with pytest.raises(KernelError, match=want) as info:
        gpu_policy.launch("k", _Broken(), (1,))
    assert isinstance(info.value.__cause__, RuntimeError)


# ------------------------------------------------------------------ float32 accumulation
def test_accumulate_dtype_float32_reaches_the_triton_kernels(
    triton_on_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batched_nerf.engines.fused.cuda import build as fused_triton

    seen: list[torch.dtype] = []
    real = fused_triton.launch

    def spy(name: str, kernel: object, grid: tuple[int, ...], *args: object, **options: object) -> None:
        seen.append(args[7].dtype)  # pos: the scratch
        real(name, kernel, grid, *args, **options)

    monkeypatch.setattr(fused_triton, "launch", spy)
    table = bn.ConstructionTable.chain(40)
    b, a, d = (t.float().requires_grad_() for t in _inputs(table, 3))
    want = bn.to_cartesian(b.double(), a.double(), d.double(), table, method="levels")
    x64 = bn.to_cartesian(b, a, d, table, method="fused")  # default: float64 scratch
    x32 = bn.to_cartesian(b, a, d, table, method="fused", accumulate_dtype=torch.float32)
    x32.square().sum().backward()  # the backward's forward and reverse walks in float32 too
    assert seen == [F64, torch.float32, torch.float32, torch.float32]
    assert x32.dtype == torch.float32 and not torch.equal(x32, x64)
    assert (x64.double() - want).abs().max() < 1e-5
    assert (x32.double() - want).abs().max() < 1e-4
    assert torch.isfinite(b.grad).all()


def test_configure_keeps_one_plan_per_option_pair() -> None:
    plan = bn.ConstructionTable.chain(5).plan("fused", "cpu")
    assert fused.configure(plan, None, False) is plan
    auto32 = fused.configure(plan, torch.float32, True)
    assert (auto32.accumulate, auto32.fallback) == (torch.float32, True)
    assert fused.configure(plan, torch.float32, True) is auto32
    assert fused.configure(plan, torch.float16, False) is plan  # float16 builds with the reference anyway


# ------------------------------------------------------------------ the compile check
@pytest.mark.slow
def test_compile_script_compiles_one_kernel_for_sm90() -> None:
    """The real Triton compiler (ptxas of the wheel) on one kernel, for one target, no GPU needed."""
    pytest.importorskip("triton", minversion="3.0", reason="the compile check needs triton >= 3")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / ".ci" / "triton_compile.py"), "--targets", "90"]
    cmd += ["--kernels", "cuda.inverse._forward_kernel", "--dtypes", "float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("cuda.inverse._forward")]
    fields = row.split()
    assert fields[1:4] == ["float32", "sm_90", "4"]  # dtype, target, num_warps
    assert 0 < int(fields[4]) <= 255 and fields[6:8] == ["0", "0"]  # registers; no spill stores or loads
    assert "OK: compiled without spills" in proc.stdout
