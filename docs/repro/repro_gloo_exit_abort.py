"""torch.distributed (gloo): a worker thread frees a collective's Python-made tensors during interpreter exit.

The pattern behind the exit-time SIGABRT of two torchrun ranks (docs/known_issues.md,
backtrace in gloo_exit_abort_backtrace.txt): the Python references to an all_gather's
tensors go away right after the call, and the interpreter exits. If gloo's worker thread
drops the finished work (the tensors' last reference) only then, freeing their Python
objects needs the GIL during finalization; CPython ends the thread inside gloo's noexcept
destructor and std::terminate aborts the process. ``--keep`` keeps the tensors referenced
from Python (the workaround: there, the worker's release is a plain reference count).

A race: the worker must be descheduled between completing the work and dropping it. It
aborted 1 in 40-45 runs of examples/distributed_training.py under load on the 2-core VM;
this stripped-down script did not abort in 36 runs there (also pinned to one busy core).
Run: ``torchrun --standalone --nproc_per_node=2 docs/repro/repro_gloo_exit_abort.py``.
"""

import sys

import torch
import torch.distributed as dist

KEEP = "--keep" in sys.argv
kept = []

dist.init_process_group("gloo")
flat = torch.ones(1000)
gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
if KEEP:
    kept.append(gathered)
sys.setswitchinterval(30.0)  # the main thread keeps the GIL until it blocks: no handover to gloo's thread
dist.all_gather(gathered, flat)
del gathered, flat  # the last Python references: the tensors now live in gloo's work object only
