"""The benchmark suite of batched_nerf (part of the repository, not of the installed package).

Modules, from the ground up:

* :mod:`benchmarks.timing`: one timed step per pass (forward, forward+backward,
  committor), :func:`~benchmarks.timing.measure` and the time formatter;
* :mod:`benchmarks.workloads`: topologies (chains, random trees, a protein-like
  backbone, alanine dipeptide), inputs, the float64 reference build and the grid;
* :mod:`benchmarks.peers`: adapters for the other builders (per-atom torch loop,
  chemcoord, mp-nerf, NeRFax, bgflow);
* :mod:`benchmarks.records`: the measurement records and the skip rules;
* :mod:`benchmarks.contenders`: timing of our engines and of the peers;
* :mod:`benchmarks.accuracy`, :mod:`benchmarks.memory`: float32 error and peak memory;
* :mod:`benchmarks.summary`: speed-ups, the headline rows and the targets;
* :mod:`benchmarks.report`: Markdown, JSON and plots;
* :mod:`benchmarks.suite`: :func:`~benchmarks.suite.run_benchmarks`, the whole run;
* ``benchmarks/run.py``: the command line.

batched_nerf is used only through its public API (``import batched_nerf as bn``).
Timings are of the kernels the dispatch rule picks, so tiered compilation is off
(``BATCHED_NERF_TIERED=0``: a blocked kernel compiles on its first call, as after
``batched-nerf warmup``; ``benchmarks/first_use.py`` measures the default).
"""

import os

os.environ.setdefault("BATCHED_NERF_TIERED", "0")
