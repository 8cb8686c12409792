"""One step of candidate selection per strategy, in torch ops only (fairseq ``search.py`` style).

Every strategy has the same signature::

    step(step, lprobs (B, k, V), scores (B, k)) -> (cand_scores (B, C), cand_tokens (B, C), cand_beams (B, C))

where B is the number of groups (images for beam search, rows for greedy/sampling), k the live hypotheses per group,
``scores`` their running sums of log-probs and C the number of candidates returned. The loops in ``beam.py`` and
``greedy.py`` turn candidates into finished and running hypotheses; on their hot paths they call the leaner forms
``BeamSearch.candidates`` (flat ``beam * V + token`` indices) and ``Search.choose`` (row-wise, C = 1), which give the
same selections with fewer tensor ops per step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from edgecap.decoding.config import DecodeCfgError


class Search:
    """Base of the candidate selectors.

    Attributes:
        reveals_nan: a NaN anywhere in a row of log-probs always shows in that row's chosen log-prob (greedy's
            ``max`` propagates NaN); lets the row loop use :meth:`ProcessorPlan.biased` and check only the chosen
            values.
    """

    reveals_nan = False

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Select candidates; see the module docstring for shapes."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def choose(self, step: int, lprobs: Tensor) -> tuple[Tensor, Tensor]:
        """The row-wise form (C = 1, k = 1) the greedy/sampling loop uses: no running scores, no reshapes.

        Args:
            step: t.
            lprobs: (N, V) processed log-probs.

        Returns:
            tokens (N,) long and their log-probs (N,). The default goes through :meth:`step`.
        """
        _, tokens, _ = self.step(step, lprobs[:, None, :], lprobs.new_zeros(lprobs.shape[0], 1))
        tokens = tokens[:, :1]
        return tokens[:, 0], lprobs.gather(1, tokens)[:, 0]


class GreedySearch(Search):
    """The most likely continuation of each hypothesis (C = 1; expects k = 1)."""

    reveals_nan = True

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        best_lp, tokens = lprobs[:, 0, :].max(dim=-1, keepdim=True)  # (B, 1)
        return scores[:, :1] + best_lp, tokens, torch.zeros_like(tokens)

    def choose(self, step: int, lprobs: Tensor) -> tuple[Tensor, Tensor]:
        best_lp, tokens = lprobs.max(dim=-1)  # one op gives both: the max *is* the chosen token's log-prob
        return tokens, best_lp


class BeamSearch(Search):
    """Top 2K continuations over all k·V (beam, token) pairs of a group.

    Returning 2K candidates (fairseq) guarantees at least K of them are not EOS, since each beam contributes only one
    EOS candidate; the loop keeps K running beams even when some candidates finish.
    """

    def __init__(self, beam_size: int) -> None:
        if beam_size < 1:
            raise DecodeCfgError(f"beam_size must be >= 1, got {beam_size}")
        self.beam_size = beam_size

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        vocab = lprobs.shape[2]
        cand_scores, flat = self.candidates(lprobs, scores[:, :, None])
        return cand_scores, flat % vocab, torch.div(flat, vocab, rounding_mode="floor")

    def candidates(self, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`step` without splitting the indices, as the beam loop consumes them.

        Args:
            lprobs: (B, k, V).
            scores: (B, k, 1) running sums.

        Returns:
            cand_scores (B, C) best first and flat (B, C) long indices ``beam * V + token`` into the k·V
            continuations, C = min(2K, k·V).
        """
        groups, k, vocab = lprobs.shape
        total = (lprobs + scores).view(groups, k * vocab)
        return total.topk(min(2 * self.beam_size, k * vocab), dim=1)


class Sampling(Search):
    """Draw one token per hypothesis from softmax(lprobs / temperature), optionally among the top k only.

    The candidate score adds the *untempered* log-prob, so scores stay log-probabilities under the model. A seeded
    ``torch.Generator`` (created on the log-probs' device at the first step) makes runs repeatable on one device.
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, seed: int | None = None) -> None:
        if not temperature > 0:
            raise DecodeCfgError(f"temperature must be > 0, got {temperature}")
        if top_k < 0:
            raise DecodeCfgError(f"top_k must be >= 0, got {top_k}")
        self.temperature, self.top_k, self.seed = float(temperature), int(top_k), seed
        self._generator: torch.Generator | None = None

    def _generator_for(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
        return self._generator

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lp = lprobs[:, 0, :]
        tokens = self._sample(lp)
        return scores[:, :1] + lp.gather(1, tokens), tokens, torch.zeros_like(tokens)

    def choose(self, step: int, lprobs: Tensor) -> tuple[Tensor, Tensor]:
        tokens = self._sample(lprobs)
        return tokens[:, 0], lprobs.gather(1, tokens)[:, 0]

    def _sample(self, lp: Tensor) -> Tensor:
        """(N, V) untempered log-probs -> (N, 1) drawn tokens (temperature and top-k applied here only)."""
        logits = lp / self.temperature if self.temperature != 1.0 else lp
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return self._draw(torch.softmax(logits, dim=-1), lp.device)

    def _draw(self, probs: Tensor, device: torch.device) -> Tensor:
        """One token per row by inverse-CDF sampling: (B, V) probabilities -> (B, 1) long.

        ``torch.multinomial`` is ~15x slower on CPU for (250, 10k) rows. ``searchsorted(..., right=True)`` returns the
        first index whose cumulative mass exceeds the uniform draw, so zero-probability (masked) tokens, whose
        cumulative value equals their predecessor's, are never chosen; a draw rounded up to the total mass falls back
        to the last token with positive probability. A row with no legal token at all (every log-prob ``-inf``, so
        softmax gives NaN) would search past the end; it gets the last token, whose log-prob ``-inf`` marks the
        sample as impossible, instead of an out-of-range index.
        """
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1:].contiguous()
        draw = torch.rand(total.shape, generator=self._generator_for(device), device=device, dtype=cdf.dtype) * total
        tokens = torch.searchsorted(cdf, draw, right=True)
        last_positive = torch.searchsorted(cdf, total)  # first index whose cumulative mass reaches the total
        return torch.minimum(tokens, last_positive).clamp_(max=probs.shape[-1] - 1)
