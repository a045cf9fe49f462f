"""A sequence of one non-standard residue, given as a list, is that residue (issue 43, item 2).

Its canonical sequence is the name itself (``"HID"``), which one-letter codes could also
spell (His-Ile-Asp): every path that reads a canonical sequence back (the table, the mixed
batch, the PDB writer) must see one residue, and three standard residues whose letters spell
such a name keep their names.
"""

from __future__ import annotations

import pytest
import torch

import batched_nerf as bn
from batched_nerf.protein import packed_proteins, parse_sequence, protein_table, write_pdb

LONE = [(["HID"], "HID"), (("HIP",), "HIP"), (["LYN"], "LYN"), (["HSD"], "HID"), (["CYX"], "CYX")]


@pytest.mark.parametrize(("given", "name"), LONE, ids=[g[0] for g, _ in LONE])
def test_a_listed_lone_residue_is_one_residue(given, name: str) -> None:
    t = protein_table(given)
    assert t.residues == (name,)
    assert t.n_residues == 1
    assert parse_sequence(given) == name
    assert protein_table(list(t.residues)) is t


def test_one_letter_codes_that_spell_a_residue_name_keep_three_residues() -> None:
    """``"HID"`` typed as one-letter codes is His-Ile-Asp, and its canonical form says so."""
    assert parse_sequence("HID") == "HIS ILE ASP"
    t = protein_table("HID")
    assert t.residues == ("HIS", "ILE", "ASP")
    assert protein_table(t.sequence) is t


def test_mixed_batch_of_lone_residues() -> None:
    p = packed_proteins([["HID"], ["CYX"], "GA"])
    assert [t.residues for t in p.tables] == [("HID",), ("CYX",), ("GLY", "ALA")]
    assert p.sequences == ("HID", "CYX", "GA")
    out = bn.protein.build_batch([["LYN"], "GA"], torch.zeros(2, 2), torch.zeros(2, 2))
    assert out.xyz.shape[-3:] == (2, 10, 3)


def test_pdb_of_a_lone_residue_names_it() -> None:
    text = write_pdb(bn.protein.build(["LYN"], torch.zeros(1), torch.zeros(1)))
    atoms = [line for line in text.splitlines() if line.startswith("ATOM")]
    assert len(atoms) == protein_table(["LYN"]).n_atoms
    assert {line[17:20] for line in atoms} == {"LYS"}
