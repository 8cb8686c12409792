"""The ONNX Runtime backend: providers and their fallback, sessions, the step and refine adapters, the bundle
loader."""
