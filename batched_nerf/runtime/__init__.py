"""What every compiled call shares, below the engines; imports nothing else of the package.

* `torch_compat`: every private torch API the package
  uses, each with its fallback and the torch releases it was checked on.
"""
