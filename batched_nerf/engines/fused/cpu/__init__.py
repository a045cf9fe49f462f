"""The fused engine's CPU backend: numba kernels (the extra ``fast``).

* :mod:`.build`: the builder's entry (``forward``, ``backward``), choosing per call
  between :mod:`.samples` (a work item per ``(sample, unit)``) and :mod:`.blocks`
  (blocks of samples innermost, vectorised across samples);
* :mod:`.trig`: vectorised float64 ``cos``/``sin`` and ``atan2`` loops;
* :mod:`.inverse`: ``to_internal``'s kernels (forward, vjp, second order), their
  blocked layout in :mod:`.inverse_blocks`, the per-row formulas both share in
  :mod:`.inverse_rows`;
* :mod:`.tiers`: when a blocked kernel may run (compiled, cached, or worth its compile);
* :mod:`.cache`: the compile announcements and the process-safe cache writes.

Imported only through :mod:`batched_nerf.engines.backends` (numba is optional).
"""
