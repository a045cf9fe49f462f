"""PLACEHOLDER (being written): log-depth engine. Delegates to the level engine for now."""

from __future__ import annotations

from ._build import build_levels


def make_plan(kind, table):
    raise ValueError(f"unknown plan kind {kind!r}")


def build_scan(table, bonds, angles, dihedrals, fixed_xyz):
    return build_levels(table.plan("levels", bonds.device), bonds, angles, dihedrals, fixed_xyz)
