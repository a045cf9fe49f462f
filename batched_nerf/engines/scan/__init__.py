"""The log-depth (scan) engine: frames composed by pointer jumping.

* `plan`: the planner (frame-tree compilation into rounds, numpy, once per
  table and band size);
* `path`: banded scans of ``3 x 3`` rotations along single paths;
* `build`: the builder ``build_scan`` and the engine record ``SCAN``.
"""
