"""MDAnalysis's ``minimize_vectors`` can miss the shortest image in a strongly skewed triclinic box.

numpy + MDAnalysis only, no batched_nerf. The box is frame 2 of MDAnalysisTests'
``DCD_TRICLINIC`` (TIP125; gamma = 40 degrees, so ``b_x = b cos(gamma) = 26.5 > a / 2``:
not in GROMACS's reduced form), the vector one between consecutive atoms after
``wrap(compound="atoms")``. ``minimize_vectors`` returns an image 19.32 long; a
brute-force search over the 343 images ``v + n H``, ``n`` in ``[-3, 3]^3``, finds
one 18.02 long. The vector is far beyond half the smallest perpendicular width
of the box (7.80), where no minimum-image convention can tell it from its images
anyway, so this is a limitation for long vectors in non-reduced boxes, not an
error below the bound (below it, both agree to rounding: tests/test_box.py).

Run: ``python docs/repro/repro_mdanalysis_minimize_vectors.py``. Seen here
(MDAnalysis 2.11.0): ``minimize_vectors: 19.3242  brute force: 18.0169``.
"""

import itertools

import numpy as np
from MDAnalysis.lib.distances import minimize_vectors
from MDAnalysis.lib.mdamath import triclinic_vectors

box = np.array([34.528, 34.664, 33.539, 90.559, 63.112, 40.14])
v = np.array([[-17.661, -3.106, -8.904]])

h = triclinic_vectors(box, dtype=np.float64)
theirs = minimize_vectors(v, box)
r = range(-3, 4)
images = v[:, None, :] + (np.array(list(itertools.product(r, r, r)), dtype=float) @ h)[None]
brute = np.linalg.norm(images, axis=-1).min(1)
widths = abs(np.linalg.det(h)) / np.linalg.norm(np.cross(h[[1, 2, 0]], h[[2, 0, 1]]), axis=-1)
print(f"minimize_vectors: {np.linalg.norm(theirs[0]):.4f}  brute force: {brute[0]:.4f}")
print(f"half the smallest perpendicular width: {widths.min() / 2:.4f}")
