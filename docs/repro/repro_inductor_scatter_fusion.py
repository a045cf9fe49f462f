"""torch 2.13.0 CPU inductor bug B (no batched_nerf): scatter fused with a reader of its output.

Five chained `g = g + zeros_like(g).index_add(1, p, g)` (the backward of pointer
jumping `g = g.index_select(1, p) + g`). Inductor fuses the 4th scatter-add into
the loop that reads its output (`out_ptr3[x1]` is loaded in the same iteration
that does `out_ptr3[p[x1]] += ...`), so contributions from later iterations are
lost. SchedulerNode.recompute_size_and_body drops mutation_renames when there are
no fake deps (fixed in torch 2.14.1). Wrong with 1 or 2 threads, any simdlen.
"""

import torch

n, steps = 16, 5
parent = torch.clamp(torch.arange(n) - 1, min=0)  # chain: parent[i] = i - 1
ptrs = [parent]
for _ in range(steps - 1):
    ptrs.append(ptrs[-1][ptrs[-1]])  # pointer jumping: ptr <- ptr[ptr]


def f(g, ptrs):
    for p in ptrs:
        g = g + torch.zeros_like(g).index_add(1, p, g)
    return g


g = torch.ones(3, n)
ref = f(g, ptrs)
out = torch.compile(f)(g, ptrs)
print(torch.__version__, "max abs err", (out - ref).abs().max().item(), "of", ref.abs().max().item())
