"""The workshop half: models, training, data, evaluation, export (graphs, bundle writing, calibration), interop
with official checkpoints, and the torch runtime. It needs the ``[train]`` extra (torch); a device never imports
it. It builds on :mod:`edgecap.runtime`, which never imports back.
"""
