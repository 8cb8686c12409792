"""Compression beyond post-training INT8, training side (torch): structured pruning and 2:4 sparsity
(``prune*``, ``sparsity``), quantisation-aware training and distillation (docs/compression.md)."""
