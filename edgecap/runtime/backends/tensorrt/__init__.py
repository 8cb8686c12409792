"""The TensorRT backend: the bundle loader and the engines it runs (built by :mod:`edgecap.runtime.engines`)."""
