"""The runtime half: everything a device imports to caption from a bundle.

Bundle reading, image preprocessing, the backends (ONNX Runtime, TensorRT), decoding, TensorRT engines and
:class:`~edgecap.Captioner`. It imports numpy, Pillow and an inference engine only (plus the standard library,
click, psutil and packaging), at module level and inside functions alike; ``tests/test_import_graph.py`` walks
every import to keep it so. The workshop half (:mod:`edgecap.workshop`) may import from here, never the reverse.
"""
