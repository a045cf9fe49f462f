"""Residue chemistry below the protein builders and the file adapters: the residue templates
(atoms, ideal geometry, chi atoms, names; ``templates``) and construction tables from MD
topologies with residue-aware torsion rows (``topology``; public as
`batched_nerf.protein.table_from_topology`). Built on ``core``.
"""
