"""The fused engine's CUDA backend: Triton kernels (the CUDA builds of torch ship triton).

* `build`: the builder's forward and vjp kernels (a lane per ``(component, sample)``), on the
  plan's rows as a device copy (`rows`);
* `inverse`: ``to_internal``'s forward and vjp kernels (a lane per ``(sample, atom)``).

Imported only through `batched_nerf.engines.backends`; the tests run these
kernels in Triton's interpreter on the CPU (``TRITON_INTERPRET=1``).
"""
