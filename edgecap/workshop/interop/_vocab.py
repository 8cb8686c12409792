"""Moving vocabulary rows: official token ids -> edgecap's special-token layout, without changing the function.

edgecap's word vocabulary puts PAD, BOS, EOS, UNK at ids 0-3 and words from id 4; the official codes put their
specials elsewhere (ExpansionNet v2 sorts them among the words) or share one id for several roles (ORT: id 0 is
both the start token fed to the decoder and the end token it emits). The embedding and output-projection rows are
moved to the new ids; an output class the official model never had (e.g. ORT's separate BOS) gets weight 0 and
bias :data:`NEVER_LOGIT`, so its probability is exactly 0 in float32 and the other classes' log-probabilities are
unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["NEVER_LOGIT", "move_rows"]

#: Bias of an output class the official model cannot emit: exp(-1e4) is 0 in float32 and float16 alike, and -1e4 is
#: representable in float16 (the FP16 bundle), unlike -inf arithmetic which would turn log-softmax into NaN.
NEVER_LOGIT = -1e4


def move_rows(tensor: torch.Tensor, sources: Sequence[int | None], fill: float = 0.0) -> torch.Tensor:
    """Row ``i`` of the result is ``tensor[sources[i]]``, or ``fill`` everywhere when ``sources[i]`` is None."""
    out = torch.full((len(sources), *tensor.shape[1:]), fill, dtype=tensor.dtype)
    for row, source in enumerate(sources):
        if source is not None:
            out[row] = tensor[source]
    return out
