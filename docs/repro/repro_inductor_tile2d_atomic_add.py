"""torch 2.13.0 CPU inductor bug A (no batched_nerf): index_add of a transposed operand.

The 2-D tiled C++ kernel (CppTile2DKernel) applies the inner tile offset twice on
its parallel atomic_add path: generated index `idx[x1] + n*x0 + 2n*x0_inner`
instead of `+ n*x0_inner`. Row 1 stays 0, row 1's values land in row 2, row 2's
values are written past the buffer (heap corruption; ASan: heap-buffer-overflow).
Needs >= 2 threads. Correct on torch 2.14.1 (same index with the fix).
"""

import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 8


def f(a, b, idx):
    return torch.zeros(3, a.shape[0]).index_add(1, idx, a.t() + b)


torch.manual_seed(0)
a, b, idx = torch.randn(n, 3), torch.randn(3, n), torch.arange(n)
ref = f(a, b, idx)
out = torch.compile(f)(a, b, idx)
print(torch.__version__, "threads", torch.get_num_threads(), "n", n)
print("row max abs err:", (out - ref).abs().amax(1).tolist())
