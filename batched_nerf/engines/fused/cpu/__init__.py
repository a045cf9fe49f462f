"""The fused engine's CPU backend: numba kernels (the extra ``fast``).

* `build`: the builder's entry (``forward``, ``backward``), choosing per call
  between `samples` (a work item per ``(sample, unit)``) and `blocks`
  (blocks of samples innermost, vectorised across samples);
* `trig`: vectorised float64 ``cos``/``sin`` and ``atan2`` loops;
* `inverse`: ``to_internal``'s kernels (forward, vjp, second order), their
  blocked layout in `inverse_blocks`, the per-row formulas both share in
  `inverse_rows`;
* `tiers`: when a blocked kernel may run (compiled, cached, or worth its compile);
* `cache`: the compile announcements and the process-safe cache writes.

Imported only through `batched_nerf.engines.backends` (numba is optional). Where numba
is installed, importing this package first runs `cache.prepare` (a fork-safe numba
threading layer, before any kernel is defined or run).
"""

try:
    import numba  # noqa: F401
except ImportError:  # no kernels; .tiers (plain Python) still imports
    pass
else:
    from .cache import prepare

    prepare()
