"""The fused engine: one compiled kernel per pass, over a flat plan of the table.

Rooms (policy above, backends below; imports point down):

* `build`: the plan (``FusedPlan``), the ``to_cartesian`` builder and its
  ``autograd.Function``\\ s, the engine record ``FUSED``;
* `inverse`: ``to_internal``'s fused pass and its ``autograd.Function``\\ s;
* `cpu`: the numba kernels (per-sample and blocked loops, the vectorised
  ``cos``/``sin``/``atan2`` loops, the inverse's per-row formulas);
* `cuda`: the Triton kernels.

The backends are found lazily by `batched_nerf.engines.backends`; nothing
here imports numba or triton.
"""
