"""First use of the numba kernels: the cache-miss announcement, ``warmup``, laziness per pass."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import batched_nerf as bn
from batched_nerf.cli import main

numba = pytest.importorskip("numba", reason="the fused CPU kernels need numba")
fused_compile = pytest.importorskip("batched_nerf.engines.fused.cpu.cache")

ROOT = Path(__file__).resolve().parent.parent


def _event(module: str, name: str, args: tuple[Any, ...], cache_path: str = "/cache/here") -> Any:
    py_func = SimpleNamespace(__module__=module, __name__=name)
    dispatcher = SimpleNamespace(py_func=py_func, _cache=SimpleNamespace(_cache_path=cache_path))
    return SimpleNamespace(data={"dispatcher": dispatcher, "args": args})


@pytest.mark.parametrize(
    ("module", "name", "args", "expected"),
    [
        (
            "batched_nerf.engines.fused.cpu.inverse_blocks",
            "second_items",
            ("int64", "array(float32, 3d, C)"),
            "to_internal second order, blocked, float32",
        ),
        (
            "batched_nerf.engines.fused.cpu.samples",
            "_backward_parallel",
            ("array(float64, 2d, C)",),
            "to_cartesian backward, per sample, threaded, float64",
        ),
        ("batched_nerf.engines.fused.cpu.trig", "_trig_items", ("float32",), "cos/sin, float32"),
        ("batched_nerf.engines.fused.cpu.pose", "_extract_items", ("float64",), "extract_pose, float64"),
        (
            "batched_nerf.engines.fused.cpu.inverse",
            "_vjp_rows",
            ("float64",),
            "backward, per sample, threaded",
        ),
    ],
)
def test_describe_names_pass_layout_and_dtype(
    module: str, name: str, args: tuple[str], expected: str
) -> None:
    text = fused_compile.describe(_event(module, name, args).data["dispatcher"], args)
    assert expected in text and f"({module.rsplit('.', 1)[1]}.{name})" in text


def test_cache_miss_announced_once_then_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fused_compile, "_announced", False)
    monkeypatch.setattr(fused_compile, "COMPILES", [])
    announcer = fused_compile._Announcer()
    caplog.set_level(logging.INFO, logger="batched_nerf")
    for name in ("_forward_items", "_backward_items"):
        ev = _event("batched_nerf.engines.fused.cpu.samples", name, ("float32",))
        announcer.on_start(ev)
        inner = _event("batched_nerf.engines.fused.cpu.samples", "_frame", ("float32",))
        announcer.on_start(inner)  # a helper compiled from inside: part of its caller's message
        announcer.on_end(inner)
        announcer.on_end(ev)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per process
    msg = warnings[0].getMessage()
    assert "to_cartesian forward, per sample, float32" in msg and "/cache/here" in msg
    assert "NUMBA_CACHE_DIR" in msg and "warmup" in msg and "one-time" in msg
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 4 and "compiled" in infos[1] and "_backward_items" in infos[2]
    assert [what.split(" (")[0] for what, _ in fused_compile.COMPILES] == [
        "to_cartesian forward, per sample, float32",
        "to_cartesian backward, per sample, float32",
    ]


def test_other_packages_compiles_are_not_announced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fused_compile, "_announced", False)
    monkeypatch.setattr(fused_compile, "COMPILES", [])
    announcer = fused_compile._Announcer()
    ev = _event("someone_else.kernels", "f", ("float64",))
    announcer.on_start(ev)
    announcer.on_end(ev)
    assert not caplog.records and not fused_compile.COMPILES


def test_cache_dir_is_numbas_choice() -> None:
    from batched_nerf.engines.fused.cpu.trig import _sincos

    path = fused_compile.cache_dir()
    assert path == str(_sincos._cache._cache_path) and os.path.isdir(path)
    if numba.config.CACHE_DIR:
        assert path.startswith(str(numba.config.CACHE_DIR))


def test_warmup_small_and_plain_progress(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # no tqdm: one plain line per step
    info = bn.warmup(dtypes=("float64",), passes=("forward",), threaded=False)
    assert info["steps"] == 2 and info["threads"] == 1 and info["compiled"] >= 0
    err = capsys.readouterr().err
    assert "batched_nerf warmup [1/2] to_cartesian forward, per sample, float64" in err
    assert "[2/2] to_cartesian forward, blocked, float64" in err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtypes": ("float16",)}, "dtypes must be among ('float32', 'float64'), got ('float16',)"),
        ({"dtypes": ()}, "dtypes must be among"),
        (
            {"passes": ("hessian",)},
            "passes must be among "
            "('forward', 'backward', 'inverse', 'second', 'flow', 'torsions', 'backbone')",
        ),
        ({"passes": ()}, "passes must be among"),
    ],
)
def test_warmup_rejects_unknown_dtypes_and_passes(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bn.warmup(progress=False, **kwargs)


@pytest.mark.parametrize("dtypes", ["float64", torch.float64, [torch.float64]])
def test_warmup_takes_one_dtype_or_pass_alone(dtypes: Any) -> None:
    """A string is one dtype (one pass), not its characters ('f', 'l', ...)."""
    info = bn.warmup(dtypes=dtypes, passes="forward", threaded=False, progress=False)
    assert info["steps"] == 2


def test_warmup_names_an_unknown_torch_dtype() -> None:
    with pytest.raises(
        ValueError, match=r"dtypes must be among \('float32', 'float64'\), got \('torch.float16',\)"
    ):
        bn.warmup(dtypes=torch.float16, progress=False)


def test_cli_warmup(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import batched_nerf._warmup as warmup_module

    seen: dict[str, Any] = {}

    def fake(dtypes: Any, threaded: bool, progress: bool) -> dict[str, Any]:
        seen.update(dtypes=list(dtypes), threaded=threaded, progress=progress)
        return {"steps": 3, "compiled": 2, "seconds": 1.5, "cache_dir": "/c", "threads": 1}

    monkeypatch.setattr(warmup_module, "warmup", fake)
    assert main(["warmup", "--dtype", "float32", "--no-threaded", "-q"]) == 0
    assert seen == {"dtypes": ["float32"], "threaded": False, "progress": False}
    out = capsys.readouterr().out
    assert "warmup: 3 steps (float32; 1 numba thread(s)), 2 kernel(s) compiled" in out and "/c" in out

    def missing(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("method='fused' needs numba on cpu")

    monkeypatch.setattr(warmup_module, "warmup", missing)
    assert main(["warmup"]) == 1
    assert "batched-nerf: error: method='fused' needs numba" in capsys.readouterr().err


def test_cli_sample_does_not_time_the_first_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            ["sample", "alanine_dipeptide", "--n", "40", "--chunk", "16", "-q", "-o", str(tmp_path / "a.xyz")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "atoms/s" in out and "not counted: a first call per batch size before timing" in out


_COLD = textwrap.dedent(
    """
    import torch, batched_nerf as bn
    from batched_nerf.engines.fused.cpu import inverse as inv
    from batched_nerf.engines.fused.cpu import inverse_blocks as blk
    table = bn.ConstructionTable.chain(10)
    for n in (1, 32):
        x = torch.randn(n, 10, 3, dtype=torch.float64, requires_grad=True)
        ic = bn.to_internal(x, table, method="fused")
        (ic.bonds.sum() + ic.dihedrals.sum()).backward()  # first order only
    print("SECOND", len(inv._second_samples.signatures), len(blk.second_items.signatures))
    """
)


@pytest.mark.slow
def test_cold_cache_announced_once_per_process_and_second_order_stays_lazy(tmp_path: Path) -> None:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    runs = [
        subprocess.run([sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, timeout=600)
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert (
            "SECOND 0 0" in run.stdout
        )  # no second-order kernel compiled (or loaded) for a first-order pass
    first, second = runs[0].stderr, runs[1].stderr
    assert first.count("batched_nerf: compiling the fused CPU kernels") == 1, first
    assert str(tmp_path / "cache") in first
    assert "compiling" not in second  # a warm cache: nothing to say


def _save_many(path: str, tag: str, n: int) -> None:
    from numba.core.caching import IndexDataCacheFile

    locked = type("Locked", (IndexDataCacheFile,), {"save": fused_compile._locked_save})
    cache_file = locked(path, "kernel", "stamp")
    for k in range(n):
        cache_file.save(f"{tag}{k}", f"code of {tag}{k}")


def test_concurrent_cache_writes_keep_every_entry_with_its_own_code(tmp_path: Path) -> None:
    """Processes compiling different signatures of one kernel into one folder at once (numba's own
    save picks the same data file in both and can name one signature's code for the other)."""
    import multiprocessing

    from numba.core.caching import IndexDataCacheFile

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), tag, 25)) for tag in "abc"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    reader = IndexDataCacheFile(str(tmp_path), "kernel", "stamp")
    index = reader._load_index()
    assert sorted(index) == sorted(f"{t}{k}" for t in "abc" for k in range(25))
    assert len(set(index.values())) == 75
    for key in index:
        assert reader.load(key) == f"code of {key}"


def test_kernels_use_the_locked_cache_write() -> None:
    from batched_nerf.engines import backends
    from batched_nerf.engines.fused.cpu import inverse_blocks as fused_inverse_numba_blocks
    from batched_nerf.engines.fused.cpu import samples as fused_numba_samples

    assert backends.available("cpu")
    for kernel in (fused_numba_samples._forward_items, fused_inverse_numba_blocks.second_items):
        assert type(kernel._cache._cache_file).save is fused_compile._locked_save


def _cached_dispatchers() -> dict[str, Any]:
    """Every numba dispatcher with a disk cache in a module of batched_nerf/engines/fused/cpu, found
    independently of the package's own search (the files of the folder)."""
    import importlib

    from numba.core.caching import NullCache

    folder = ROOT / "batched_nerf" / "engines" / "fused" / "cpu"
    found: dict[str, Any] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"batched_nerf.engines.fused.cpu.{path.stem}")
        for value in vars(module).values():
            cache = getattr(value, "_cache", None)
            if hasattr(value, "py_func") and cache is not None and not isinstance(cache, NullCache):
                found[f"{value.py_func.__module__}.{value.py_func.__name__}"] = value
    return found


def test_every_cached_kernel_uses_the_locked_cache_write() -> None:
    """Every kernel module is found (the hand-kept list left out entries' kernels, and any new
    module), so every cached kernel gets the process-safe write."""
    from batched_nerf.engines import backends

    assert backends.available("cpu")
    kernels = _cached_dispatchers()
    modules = {name.rsplit(".", 2)[-2] for name in kernels}
    assert {"trig", "samples", "blocks", "inverse", "inverse_blocks", "pose"} <= modules
    unlocked = [
        name
        for name, k in kernels.items()
        if type(k._cache._cache_file).save is not fused_compile._locked_save
    ]
    assert unlocked == []


def test_install_doc_names_the_cache_folders_numba_uses() -> None:
    """docs/install.md names the folders numba picks for the kernels (it said ``engines_<hash>``)."""
    from numba.core.caching import _CacheLocator

    from batched_nerf.engines.fused.cpu import trig

    subpath = _CacheLocator.get_suitable_cache_subpath(trig.__file__)
    prefix = subpath.rsplit("_", 1)[0]
    doc = (ROOT / "docs" / "install.md").read_text()
    assert f"`{prefix}_<hash>`" in doc and f"`~/.cache/numba/{prefix}_<hash>`" in doc
    in_tree = os.path.relpath(os.path.join(os.path.dirname(trig.__file__), "__pycache__"), ROOT)
    assert f"`{in_tree}`" in doc
    assert "engines_<hash>" not in doc


def _toy(folder: Path, k: int) -> Any:
    """A fresh import of ``folder/toy.py`` (a cached numba kernel ``f``) with the package's cache file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_toy_kernels_{k}", folder / "toy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert fused_compile.lock_cache_writes(module) == 1
    return module.f


@pytest.mark.parametrize("broken", ["nbc", "nbi"])
@pytest.mark.parametrize("how", ["truncated", "empty"])
def test_a_corrupt_cache_file_is_a_miss_recompiled_and_named(
    tmp_path: Path, broken: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "toy.py").write_text(
        "import numba\n\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n"
    )
    assert _toy(tmp_path, 0)(1.0) == 2.0  # compiled, saved
    (path,) = (tmp_path / "__pycache__").glob(f"toy.f-*.{broken}")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"")
    with caplog.at_level(logging.WARNING, logger="batched_nerf"):
        f = _toy(tmp_path, 1)
        assert f(1.0) == 2.0  # numba alone raises EOFError / UnpicklingError here, at every call
    assert sum(f.stats.cache_misses.values()) == 1
    (record,) = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert str(path) in record.getMessage() and "compiles again" in record.getMessage()
    again = _toy(tmp_path, 2)  # the compile overwrote the file: a hit
    assert again(1.0) == 2.0 and sum(again.stats.cache_hits.values()) == 1


@pytest.mark.skipif(torch.__version__ < "2.4", reason="torch < 2.4 imports torch._dynamo early on purpose")
def test_import_does_not_load_dynamo() -> None:
    """``import batched_nerf`` leaves ``torch._dynamo`` unloaded (about 2 s here, which a
    ``torch.compiler.disable`` at class definition paid on every import); a plan made once it is
    loaded wraps the eager plan maker then, so that a later compile meets it wrapped."""
    code = textwrap.dedent(
        """
        import sys
        import torch
        import batched_nerf as bn
        from batched_nerf.core import table
        assert "torch._dynamo" not in sys.modules, "imported by batched_nerf"
        bn.ConstructionTable.chain(4).plan("scan")
        assert not table._EAGER
        import torch._dynamo
        bn.ConstructionTable.chain(5).plan("scan")
        assert "make_plan" in table._EAGER
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
