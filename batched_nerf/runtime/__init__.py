"""What every compiled call shares, below the engines; imports nothing else of the package.

* `torch_compat`: every private torch API the package uses, each with its fallback and the
  torch releases it was checked on;
* `gate`: may a compiled kernel serve a call, and how (plain kernel, its autograd Function, or
  the torch reference), from the call's tensors only;
* `state`: the one owner of derived per-table state (plans, memo entries) and the registry of
  the process-wide pools, with ``cache_info``.
"""
