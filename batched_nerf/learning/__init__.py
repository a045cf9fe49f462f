"""Tools for learning on internal coordinates: the flow layer (``flow``),
the informative-entry layout (``entries``) and the log-determinants (``logdet``).
Built on ``core``; the public losses live in `batched_nerf.losses`.
"""
