"""Molecules in torsion space: rotatable bonds and `RotorTable` (``rotors``), torsions read,
set and matched and the torsion log-volume (``ops``), tables from PyG batches and RDKit
molecules (``inputs``). Built on ``core``.
"""
