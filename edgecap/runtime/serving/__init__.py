"""Captions served to many clients: a Triton Inference Server model over a bundle, and the client that calls it.

The server is NVIDIA's own (the ``tritonserver`` binary that the ``nvidia-pytriton`` wheel ships): it owns HTTP/gRPC,
dynamic batching, queue limits, health and metrics. edgecap supplies the Python-backend model that captions a batch
(:mod:`~edgecap.runtime.serving.triton_model`), the model repository around a bundle
(:mod:`~edgecap.runtime.serving.repository`), the launcher (:mod:`~edgecap.runtime.serving.server`) and the client
(:mod:`~edgecap.runtime.serving.client`). ``docs/serving.md`` says how and why.
"""
