"""The torch runtime: a bundle's (or a run's) torch weights decoded in torch, eager or with static caches, and the
torch arrays the ONNX Runtime io-binding path keeps on the GPU. ``[train]`` only: :mod:`.plugin` registers it with
the runtime half through entry points, which the runtime reads when a torch path is asked for; the runtime never
imports or names it.
"""
