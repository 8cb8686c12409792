"""The torch runtime: a bundle's (or a run's) torch weights decoded in torch, eager or with static caches, and the
torch arrays the ONNX Runtime io-binding path keeps on the GPU. ``[train]`` only: the runtime half reaches it
through import strings resolved when a torch path is asked for, never through an import.
"""
