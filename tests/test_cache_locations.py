"""Where the kernels' numba cache cannot be written: no folder at all, a read-only warm
``NUMBA_CACHE_DIR``, a ``NUMBA_CACHE_DIR`` that is a file. Each in a fresh process (numba picks
the folder when the kernel modules are imported)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="the fused CPU kernels need numba")

ROOT = Path(__file__).resolve().parent.parent

#: argv[1]: how numba's own locators fail ("none": they don't; "all": every folder refuses writes;
#: "cache-dir": NUMBA_CACHE_DIR's folder refuses writes, as a read-only mount does, also for root);
#: argv[2:]: dtypes to convert. Prints COMPILES, the cache folder, OK.
_RUN = textwrap.dedent(
    """
    import os, sys
    import numba.core.caching as caching
    from numba.core import config

    how = sys.argv[1]
    base = caching._CacheLocator.ensure_cache_path

    def refuse(self):
        path = self.get_cache_path()
        if how == "all" or (how == "cache-dir" and path.startswith(str(config.CACHE_DIR))):
            raise PermissionError(13, "read-only (test)", path)
        base(self)

    caching._CacheLocator.ensure_cache_path = refuse
    import torch, batched_nerf as bn
    from batched_nerf.engines.fused.cpu import cache

    assert bn.backends()["fused"]["cpu"]
    table = bn.ConstructionTable.chain(12)
    for name in sys.argv[2:]:
        dt = getattr(torch, name)
        g = torch.Generator().manual_seed(0)
        b = (1.5 + 0.1 * torch.rand(1, 12, generator=g, dtype=torch.float64)).to(dt)
        a = (1.9 + 0.1 * torch.rand(1, 12, generator=g, dtype=torch.float64)).to(dt)
        d = (3.0 * torch.rand(1, 12, generator=g, dtype=torch.float64) - 1.5).to(dt)
        fused = bn.to_cartesian(b, a, d, table, method="fused")
        assert torch.allclose(fused, bn.to_cartesian(b, a, d, table, method="scan"), atol=1e-4)
        bn.to_cartesian(b, a, d, table)  # the default method too
    print("COMPILES", len(cache.COMPILES))
    print("DIR", cache.cache_dir())
    print("OK")
    """
)


def _run(how: str, *dtypes: str, cache_dir: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    return subprocess.run(
        [sys.executable, "-c", _RUN, how, *dtypes], env=env, capture_output=True, text=True, timeout=900
    )


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_no_writable_cache_folder_compiles_in_memory_with_one_warning() -> None:
    """numba alone raises "cannot cache function '_sincos': no locator available" at import."""
    run = _run("all", "float64", cache_dir=None)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "OK" in run.stdout and "DIR (none: compiled in memory" in run.stdout
    assert run.stderr.count("no writable folder for numba's cache of the CPU kernels") == 1, run.stderr
    assert (
        "NUMBA_CACHE_DIR is unset" in run.stderr and "Set NUMBA_CACHE_DIR to a writable folder" in run.stderr
    )
    assert "kept in memory only" in run.stderr  # the first-compile message says so too


def test_a_read_only_warm_cache_dir_is_loaded_from(tmp_path: Path) -> None:
    """The container recipe: warm NUMBA_CACHE_DIR at build time, run on a read-only filesystem."""
    cache = tmp_path / "cache"
    warm = _run("none", "float64", cache_dir=cache)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "COMPILES 0" not in warm.stdout  # a cold cache: compiled, saved
    before = _listing(cache)
    if os.geteuid() != 0:  # a real read-only folder (root writes through the mode bits: simulated)
        for path in [cache, *cache.rglob("*")]:
            path.chmod(path.stat().st_mode & 0o555)
    try:
        run = _run("cache-dir", "float64", cache_dir=cache)
        assert run.returncode == 0, run.stderr[-3000:]
        assert "COMPILES 0" in run.stdout, run.stderr[-3000:]  # loaded, not compiled again elsewhere
        assert f"DIR {cache}" in run.stdout
        assert "compiling" not in run.stderr
        miss = _run("cache-dir", "float32", cache_dir=cache)  # not in the warm cache: compiled, not saved
        assert miss.returncode == 0, miss.stderr[-3000:]
        assert "COMPILES 0" not in miss.stdout and f"DIR {cache}" in miss.stdout
        assert "is read-only (loads only)" in miss.stderr
        assert _listing(cache) == before
    finally:
        for path in [cache, *cache.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)


def test_warmup_names_a_cache_dir_that_is_a_file(tmp_path: Path) -> None:
    """It exited 0, having cached in the package folder without a word."""
    target = tmp_path / "not-a-folder"
    target.write_text("")
    code = "from batched_nerf.cli import main; raise SystemExit(main(['warmup', '--no-threaded', '-q']))"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(target))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"warmup: NUMBA_CACHE_DIR='{target}' is a file, not a folder, so the kernels would" in run.stderr
    # the warning at load, for every use (not warmup only)
    assert (
        f"NUMBA_CACHE_DIR='{target}' is a file, not a folder, so numba caches the CPU kernels in"
        in run.stderr
    )
    assert "compiling" not in run.stderr  # refused before compiling anything
