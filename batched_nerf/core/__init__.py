"""The table and the two maps: `ConstructionTable`, the input checks, `to_cartesian`,
`to_internal`, pose, periodic boxes, packing, ``compile_builder``, `ZMatrix`, and the
file helpers every adapter shares (``files``). Built on ``topology`` and ``engines``.
"""
