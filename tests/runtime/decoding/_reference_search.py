"""A frozen copy of the decoding search as it was before the per-step overhead work (beam search, the row-wise
greedy/sampling loop, processors, radix constraint), kept as the reference the optimised search must match bit for
bit (``test_search_equivalence.py``). Test-only: nothing in ``edgecap`` imports it. Data types that did not change
(``DecodeCfg``, ``Hypothesis``, ``LengthPenalty``, ``StepContext``) come from the package.

Three changes since it was frozen, where the numpy search defines what torch left open or changed on purpose:
candidates of equal score rank the lower index first (a stable sort; ``torch.topk`` leaves the order of ties
unspecified), samples draw their uniforms from a seeded ``numpy.random.Generator`` (the numpy search's stream), and
the radix cap (a step where only EOS is legal: no whole word fits) is not run, hypotheses still going end there as
they stand, as the official ACORT search stops at ``seq_length`` (:func:`at_radix_cap`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from edgecap.runtime.decoding.config import DecodeCfg, DecodeCfgError, RadixSpec
from edgecap.runtime.decoding.processors import LengthPenalty, LogitsProcessor, StepContext
from edgecap.runtime.decoding.protocol import DecodeInputError, Hypothesis, StepModel, batch_size_of

NEG_INF = float("-inf")


def device_of(state: Mapping[str, Any]) -> torch.device:
    """Device of the first torch tensor in ``state`` (CPU when the state holds none)."""
    for value in state.values():
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")


def check_logprobs(logprobs: Any, rows: int) -> Tensor:
    """Validate a step's output: a (rows, V) tensor, returned as a float32 *copy*.

    Processors edit log-probs in place; the copy keeps them from writing into a buffer the backend still owns (a
    zero-copy view of an ONNX Runtime output, a cached tensor) or into a torch inference tensor.
    """
    if not isinstance(logprobs, Tensor):
        raise DecodeInputError(f"step() must return a torch.Tensor of log-probs, got {type(logprobs)!r}")
    if logprobs.dim() != 2 or logprobs.shape[0] != rows:
        raise DecodeInputError(f"step() returned log-probs of shape {tuple(logprobs.shape)}, expected ({rows}, V)")
    return logprobs.to(torch.float32, copy=True)


class Search:
    """Base of the candidate selectors."""

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Select candidates; see the module docstring for shapes."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")


class GreedySearch(Search):
    """The most likely continuation of each hypothesis (C = 1; expects k = 1)."""

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        best_lp, tokens = lprobs[:, 0, :].max(dim=-1, keepdim=True)  # (B, 1)
        return scores[:, :1] + best_lp, tokens, torch.zeros_like(tokens)


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
        groups, k, vocab = lprobs.shape
        total = (scores[:, :, None] + lprobs).view(groups, k * vocab)
        count = min(2 * self.beam_size, k * vocab)
        cand_scores, flat = total.sort(dim=1, descending=True, stable=True)  # topk with ties by lower index
        cand_scores, flat = cand_scores[:, :count], flat[:, :count]
        return cand_scores, flat % vocab, torch.div(flat, vocab, rounding_mode="floor")


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
        self._rng = np.random.default_rng(seed)

    def step(self, step: int, lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lp = lprobs[:, 0, :]
        logits = lp / self.temperature if self.temperature != 1.0 else lp
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        tokens = self._draw(torch.softmax(logits, dim=-1), lp.device)
        return scores[:, :1] + lp.gather(1, tokens), tokens, torch.zeros_like(tokens)

    def _draw(self, probs: Tensor, device: torch.device) -> Tensor:
        """One token per row by inverse-CDF sampling: (B, V) probabilities -> (B, 1) long.

        ``torch.multinomial`` is ~15x slower on CPU for (250, 10k) rows. ``searchsorted(..., right=True)`` returns the
        first index whose cumulative mass exceeds the uniform draw, so zero-probability (masked) tokens, whose
        cumulative value equals their predecessor's, are never chosen; a draw rounded up to the total mass falls back
        to the last token with positive probability.
        """
        cdf = probs.cumsum(dim=-1)
        total = cdf[:, -1:].contiguous()
        draw = torch.from_numpy(self._rng.random(tuple(total.shape), dtype=np.float32)).to(device) * total
        tokens = torch.searchsorted(cdf, draw, right=True)
        last_positive = torch.searchsorted(cdf, total)  # first index whose cumulative mass reaches the total
        return torch.minimum(tokens, last_positive)


class ForbidTokens:
    """Never generate the given tokens (PAD and BOS always; optionally ``<unk>`` and others)."""

    def __init__(self, token_ids: Iterable[int]) -> None:
        self.token_ids = sorted(set(int(t) for t in token_ids))

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        if self.token_ids:
            logprobs[:, self.token_ids] = NEG_INF
        return logprobs

    def __repr__(self) -> str:
        return f"ForbidTokens({self.token_ids})"


class MinLength:
    """Forbid EOS until ``min_len`` tokens have been generated."""

    def __init__(self, min_len: int, eos_id: int) -> None:
        self.min_len, self.eos_id = min_len, eos_id

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        if ctx.step < self.min_len:
            logprobs[:, self.eos_id] = NEG_INF
        return logprobs

    def __repr__(self) -> str:
        return f"MinLength({self.min_len}, eos_id={self.eos_id})"


class NoRepeatNGram:
    """Forbid any token that would repeat an n-gram already present in the row (fairseq ``no_repeat_ngram_size``).

    Vectorised over rows: every (n−1)-gram of the history is compared with the row's last n−1 tokens, and the token
    that followed each match is banned.
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise DecodeCfgError(f"no_repeat_ngram must be >= 1, got {n}")
        self.n = n

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        tokens, n = ctx.tokens, self.n
        rows, t = tokens.shape
        if rows == 0 or t < n:  # no complete n-gram in the history yet
            return logprobs
        grams = tokens.unfold(1, n, 1)  # (N, t-n+1, n)
        tail = tokens[:, t - n + 1 :]  # (N, n-1): the prefix an n-gram ending now would start with
        valid = (grams[:, :, :-1] == tail[:, None, :]).all(dim=2)
        banned = grams[:, :, -1]
        vocab = logprobs.shape[1]
        # Scatter into one spare column so unmatched positions need no branch.
        mask = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=logprobs.device)
        mask.scatter_(1, torch.where(valid, banned, torch.full_like(banned, vocab)), True)
        return logprobs.masked_fill_(mask[:, :vocab], NEG_INF)

    def __repr__(self) -> str:
        return f"NoRepeatNGram({self.n})"


def apply_processors(processors: Sequence[LogitsProcessor], logprobs: Tensor, ctx: StepContext) -> Tensor:
    """Run ``processors`` in order on ``logprobs`` (N, V)."""
    for processor in processors:
        logprobs = processor(logprobs, ctx)
    return logprobs


def build_processors(cfg: DecodeCfg) -> list[LogitsProcessor]:
    """The processors a :class:`DecodeCfg` asks for: PAD/BOS (+ ``forbid_tokens``) masked, min length, n-gram
    blocking, and the radix constraint when ``cfg.radix`` is set."""

    processors: list[LogitsProcessor] = [ForbidTokens({cfg.pad_id, cfg.bos_id, *cfg.forbid_tokens})]
    if cfg.min_len > 0:
        processors.append(MinLength(cfg.min_len, cfg.eos_id))
    if cfg.no_repeat_ngram > 0:
        processors.append(NoRepeatNGram(cfg.no_repeat_ngram))
    if cfg.radix is not None:
        processors.append(RadixConstraint.from_spec(cfg.radix))
    return processors


def at_radix_cap(procs: Sequence[LogitsProcessor], t: int, max_len: int, vocab: int, eos_id: int) -> bool:
    """Whether the history-independent processors leave EOS the only legal token at step ``t`` (t > 0)."""
    static = [p for p in procs if isinstance(p, (ForbidTokens, MinLength, RadixConstraint))]
    if t == 0 or not static:
        return False
    lp = apply_processors(static, torch.zeros(1, vocab), StepContext(t, max_len, torch.zeros(1, t, dtype=torch.long)))
    return torch.isfinite(lp[0]).nonzero().flatten().tolist() == [eos_id]


class RadixConstraint:
    """Mask tokens that cannot continue a legal radix caption.

    At step t every row is at digit position p = t mod d of its current word (all rows of a search share t).

    - PAD and BOS are never legal.
    - EOS is legal only at a word boundary (p = 0).
    - A digit is legal only if some completion of the word keeps its index <= ``limit`` (N−1, or N−2 when ``<unk>``
      is suppressed): with the word's earlier digits forming the prefix value P, the largest legal digit is the
      limit's digit at p when P equals the limit's prefix, else v−1.
    - At a word boundary with fewer than d steps left before ``max_len``, no word can be completed, so only EOS is
      legal (a cut caption never ends mid-word).

    Vectorised over the (N, V) batch: the prefix value of each row comes from its last p tokens.
    """

    def __init__(self, spec: RadixSpec) -> None:
        self.spec = spec
        v, d = spec.base, spec.digits
        self.pad_id, self.bos_id, self.eos_id = 0, v + 1, v + 2
        self.vocab_size = v + 3
        self.limit = spec.num_words - 1 if spec.allow_unk else spec.num_words - 2
        limit = max(self.limit, 0)
        # limit_prefix[p]: value of the limit's first p digits; limit_digit[p]: its digit at position p.
        self.limit_prefix = [limit // v ** (d - p) for p in range(d)]
        self.limit_digit = [(limit // v ** (d - 1 - p)) % v for p in range(d)]
        self._digit_values: dict[torch.device, Tensor] = {}

    @classmethod
    def from_spec(cls, spec: RadixSpec) -> RadixConstraint:
        return cls(spec)

    @classmethod
    def from_vocab(cls, vocab: Any, *, allow_unk: bool = True) -> RadixConstraint:
        """Build from a radix vocabulary (duck-typed: ``base``, ``digits``, ``num_words``, ``pad_id``, ``bos_id``,
        ``eos_id``), checking that its token ids follow the layout this constraint assumes."""
        missing = [a for a in ("base", "digits", "num_words", "pad_id", "bos_id", "eos_id") if not hasattr(vocab, a)]
        if missing:
            raise DecodeCfgError(f"{type(vocab).__name__} is not a radix vocabulary: missing {missing}")
        spec = RadixSpec(int(vocab.base), int(vocab.digits), int(vocab.num_words), allow_unk=allow_unk)
        got = (vocab.pad_id, vocab.bos_id, vocab.eos_id)
        want = (0, spec.base + 1, spec.base + 2)
        if tuple(got) != want:
            raise DecodeCfgError(f"radix vocabulary has (pad, bos, eos) = {got}, expected {want} for base {spec.base}")
        return cls(spec)

    def max_digit(self, prefix_value: Tensor, position: int) -> Tensor:
        """Largest legal digit at ``position`` for each row's word prefix value (N,) → (N,) long; −1 = none."""
        if self.limit < 0:
            return torch.full_like(prefix_value, -1)
        free = torch.full_like(prefix_value, self.spec.base - 1)
        bounded = torch.full_like(prefix_value, self.limit_digit[position])
        out = torch.where(prefix_value == self.limit_prefix[position], bounded, free)
        return out.masked_fill(prefix_value > self.limit_prefix[position], -1)

    def allowed(self, ctx: StepContext, rows: int, vocab_size: int, device: torch.device) -> Tensor:
        """(N, V) bool: which tokens each row may generate at step ``ctx.step``."""
        if vocab_size != self.vocab_size:
            raise DecodeCfgError(
                f"radix base {self.spec.base} implies {self.vocab_size} output classes, the model has {vocab_size}"
            )
        v, d, t = self.spec.base, self.spec.digits, ctx.step
        position = t % d
        allowed = torch.zeros(rows, vocab_size, dtype=torch.bool, device=device)
        if position == 0:
            allowed[:, self.eos_id] = True
            if t + d > ctx.max_len:  # no room left to complete another word
                return allowed
        prefix = torch.zeros(rows, dtype=torch.long, device=device)
        if position:
            digits = ctx.tokens[:, t - position : t].to(device=device, dtype=torch.long) - 1
            for j in range(position):
                prefix = prefix * v + digits[:, j]
        values = self._digit_values.get(device)
        if values is None:
            values = self._digit_values[device] = torch.arange(v, device=device)
        allowed[:, 1 : v + 1] = values[None, :] <= self.max_digit(prefix, position)[:, None]
        return allowed

    def __call__(self, logprobs: Tensor, ctx: StepContext) -> Tensor:
        allowed = self.allowed(ctx, logprobs.shape[0], logprobs.shape[1], logprobs.device)
        return logprobs.masked_fill_(~allowed, NEG_INF)

    def __repr__(self) -> str:
        s = self.spec
        return f"RadixConstraint(base={s.base}, digits={s.digits}, num_words={s.num_words}, allow_unk={s.allow_unk})"


class _Finished:
    """The best ``capacity`` finished hypotheses of one image, best first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[Hypothesis] = []

    def add(self, hyp: Hypothesis) -> None:
        self.items.append(hyp)
        self.items.sort(key=lambda h: -h.score)  # stable: earlier hypotheses win ties
        del self.items[self.capacity :]

    @property
    def full(self) -> bool:
        return len(self.items) >= self.capacity

    @property
    def worst(self) -> float:
        return self.items[-1].score if self.items else NEG_INF


@torch.inference_mode()
def beam_search(
    step_model: StepModel,
    inputs: Mapping[str, Tensor],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of images (see the module docstring for the exact rules).

    Args:
        step_model: any :class:`StepModel`.
        inputs: encoder inputs with batch B.
        cfg: ``beam_size`` K, ``n_best``, ``max_len``, ``length_penalty``/``length_penalty_alpha``, processor options,
            ``prune_finished``.
        processors: replaces the processors ``cfg`` would build.

    Returns:
        For each of the B images, its ``n_best`` best hypotheses, best first (fewer only if the processors leave fewer
        legal sequences).
    """
    procs = build_processors(cfg) if processors is None else list(processors)
    beam = cfg.beam_size
    penalty = LengthPenalty(cfg.length_penalty, cfg.length_penalty_alpha)
    search = BeamSearch(beam)

    state = step_model.encode(inputs)
    images = batch_size_of(state)
    device = device_of(state)
    finished = [_Finished(beam) for _ in range(images)]
    done = [False] * images
    active = list(range(images))  # image of each group of rows in the batch

    k = 1  # live beams per image: 1 at step 0, K afterwards
    live_tokens = torch.full((images,), cfg.bos_id, dtype=torch.long, device=device)
    seqs = torch.empty(images, 0, dtype=torch.long, device=device)  # (n·k, t)
    seq_lps = torch.empty(images, 0, dtype=torch.float32, device=device)
    scores = torch.zeros(images, device=device)

    vocab = 0
    for t in range(cfg.max_len):
        groups = len(active)
        if at_radix_cap(procs, t, cfg.max_len, vocab, cfg.eos_id):
            _finish_running(scores, seqs, seq_lps, k, active, done, finished, penalty)
            break
        lp, state = step_model.step(live_tokens, state)
        lp = check_logprobs(lp.to(device), groups * k)
        lp = apply_processors(procs, lp, StepContext(t, cfg.max_len, seqs))
        vocab = lp.shape[1]

        cand_scores, cand_tokens, cand_beams = search.step(t, lp.view(groups, k, vocab), scores.view(groups, k))
        n_cand = cand_scores.shape[1]
        cand_lps = lp.view(groups, k * vocab).gather(1, cand_beams * vocab + cand_tokens)
        is_eos = cand_tokens.eq(cfg.eos_id)
        rank = torch.arange(n_cand, device=device).expand(groups, n_cand)
        to_finish = is_eos & (rank < beam) & torch.isfinite(cand_scores)

        # The K best non-EOS candidates continue (EOS ones sort last and, if picked at all, are dead).
        order = torch.where(is_eos, rank + n_cand, rank).argsort(dim=1)[:, :beam]
        next_scores = cand_scores.gather(1, order).masked_fill(is_eos.gather(1, order), NEG_INF)
        next_tokens, next_lps = cand_tokens.gather(1, order), cand_lps.gather(1, order)
        src = (torch.arange(groups, device=device) * k)[:, None] + cand_beams.gather(1, order)
        if order.shape[1] < beam:  # fewer than K candidates exist (tiny vocabulary): pad with dead beams
            pad = beam - order.shape[1]
            next_scores = torch.cat([next_scores, next_scores.new_full((groups, pad), NEG_INF)], 1)
            next_tokens = torch.cat([next_tokens, next_tokens.new_full((groups, pad), cfg.pad_id)], 1)
            next_lps = torch.cat([next_lps, next_lps.new_full((groups, pad), NEG_INF)], 1)
            src = torch.cat([src, src[:, :1].expand(groups, pad)], 1)
        src = src.reshape(-1)

        _finish_eos(to_finish, cand_beams, cand_scores, cand_lps, seqs, seq_lps, k, t, active, done, finished, penalty)
        seqs = torch.cat([seqs.index_select(0, src), next_tokens.reshape(-1, 1)], dim=1)
        seq_lps = torch.cat([seq_lps.index_select(0, src), next_lps.reshape(-1, 1)], dim=1)
        next_scores = next_scores.reshape(-1)

        if t == cfg.max_len - 1:
            _finish_running(next_scores, seqs, seq_lps, beam, active, done, finished, penalty)
            break
        best_running = next_scores.view(groups, beam).max(dim=1).values.tolist()
        for g, image in enumerate(active):
            if done[image]:
                continue
            bound = penalty.upper_bound(best_running[g], t + 2, cfg.max_len)
            if bound == NEG_INF or (finished[image].full and bound <= finished[image].worst):
                done[image] = True
        if all(done):
            break

        keep = [g for g, image in enumerate(active) if not done[image]] if cfg.prune_finished else list(range(groups))
        if len(keep) < groups:
            rows = (torch.tensor(keep, device=device)[:, None] * beam + torch.arange(beam, device=device)).reshape(-1)
            src, seqs, seq_lps = src[rows], seqs[rows], seq_lps[rows]
            next_scores, next_tokens = next_scores[rows], next_tokens.reshape(-1)[rows]
            active = [active[g] for g in keep]
        state = step_model.select(state, src)
        live_tokens, scores, k = next_tokens.reshape(-1), next_scores, beam

    return [f.items[: cfg.n_best] for f in finished]


def _finish_eos(
    to_finish: Tensor,
    cand_beams: Tensor,
    cand_scores: Tensor,
    cand_lps: Tensor,
    seqs: Tensor,
    seq_lps: Tensor,
    k: int,
    t: int,
    active: list[int],
    done: list[bool],
    finished: list[_Finished],
    penalty: LengthPenalty,
) -> None:
    """Move the EOS candidates of this step into their images' finished lists (one host transfer)."""
    where = to_finish.nonzero()
    if where.numel() == 0:
        return
    groups, cols = where[:, 0], where[:, 1]
    src = groups * k + cand_beams[groups, cols]
    prefixes, prefix_lps = seqs[src].tolist(), seq_lps[src].tolist()
    eos_lps, raws = cand_lps[groups, cols].tolist(), cand_scores[groups, cols].tolist()
    for g, prefix, lps, eos_lp, raw in zip(groups.tolist(), prefixes, prefix_lps, eos_lps, raws, strict=True):
        image = active[g]
        if not done[image]:
            finished[image].add(Hypothesis(prefix, penalty(raw, t + 1), [*lps, eos_lp], True))


def _finish_running(
    scores: Tensor,
    seqs: Tensor,
    seq_lps: Tensor,
    beam: int,
    active: list[int],
    done: list[bool],
    finished: list[_Finished],
    penalty: LengthPenalty,
) -> None:
    """Force-finish the running beams at ``max_len`` (no EOS appended)."""
    length = seqs.shape[1]
    for row, (raw, tokens, lps) in enumerate(zip(scores.tolist(), seqs.tolist(), seq_lps.tolist(), strict=True)):
        image = active[row // beam]
        if raw != NEG_INF and not done[image]:
            finished[image].add(Hypothesis(tokens, penalty(raw, length), lps, False))


@torch.inference_mode()
def decode_rows(
    step_model: StepModel,
    inputs: Mapping[str, Tensor],
    cfg: DecodeCfg,
    search: Search,
    rows_per_image: int = 1,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Decode ``rows_per_image`` independent hypotheses per image, choosing each token with ``search`` (C = 1).

    Returns:
        For each of the B images, its ``rows_per_image`` hypotheses in row order; ``score`` is the sum of the
        per-token log-probs (EOS included when finished).
    """
    procs = build_processors(cfg) if processors is None else list(processors)
    state = step_model.encode(inputs)
    images = batch_size_of(state)
    device = device_of(state)
    total = images * rows_per_image

    tokens_out = torch.full((total, cfg.max_len), cfg.pad_id, dtype=torch.long, device=device)
    logprobs_out = torch.zeros(total, cfg.max_len, dtype=torch.float32, device=device)
    lengths = torch.full((total,), cfg.max_len, dtype=torch.long, device=device)  # tokens incl. EOS
    ended = torch.zeros(total, dtype=torch.bool, device=device)

    row_ids = torch.arange(total, device=device)  # output row of each live row
    live_tokens = torch.full((images,), cfg.bos_id, dtype=torch.long, device=device)
    history = torch.empty(images, 0, dtype=torch.long, device=device)
    scores = torch.zeros(images, device=device)
    vocab = 0
    for t in range(cfg.max_len):
        if at_radix_cap(procs, t, cfg.max_len, vocab, cfg.eos_id):
            lengths[~ended] = t
            break
        lp, state = step_model.step(live_tokens, state)
        lp = check_logprobs(lp.to(device), live_tokens.shape[0])
        vocab = lp.shape[1]
        if t == 0 and rows_per_image > 1:
            expand = torch.arange(images, device=device).repeat_interleave(rows_per_image)
            state = step_model.select(state, expand)
            lp, history, scores = lp[expand], history[expand], scores[expand]
        lp = apply_processors(procs, lp, StepContext(t, cfg.max_len, history))
        new_scores, tokens, _ = search.step(t, lp[:, None, :], scores[:, None])
        tokens, new_scores = tokens[:, 0], new_scores[:, 0]

        writable = ~ended[row_ids]
        rows = row_ids[writable]
        tokens_out[rows, t] = tokens[writable]
        logprobs_out[rows, t] = lp.gather(1, tokens[:, None])[:, 0][writable]
        is_eos = tokens.eq(cfg.eos_id) & writable
        lengths[row_ids[is_eos]] = t + 1
        ended[row_ids[is_eos]] = True

        if t == cfg.max_len - 1 or bool(ended.all()):
            break
        history = torch.cat([history, tokens[:, None]], dim=1)
        scores = new_scores
        if cfg.prune_finished:
            if bool(is_eos.any()):
                keep = (~is_eos).nonzero().squeeze(1)
                state = step_model.select(state, keep)
                row_ids, history, scores, tokens = row_ids[keep], history[keep], scores[keep], tokens[keep]
            live_tokens = tokens
        else:
            live_tokens = torch.where(ended[row_ids], torch.full_like(tokens, cfg.pad_id), tokens)

    return _collect(tokens_out, logprobs_out, lengths, ended, images, rows_per_image)


def _collect(
    tokens: Tensor, logprobs: Tensor, lengths: Tensor, ended: Tensor, images: int, rows_per_image: int
) -> list[list[Hypothesis]]:
    tokens_l, logprobs_l = tokens.cpu().tolist(), logprobs.cpu().tolist()
    lengths_l, ended_l = lengths.cpu().tolist(), ended.cpu().tolist()
    out: list[list[Hypothesis]] = []
    for image in range(images):
        hyps = []
        for row in range(image * rows_per_image, (image + 1) * rows_per_image):
            n, fin = lengths_l[row], ended_l[row]
            lps = logprobs_l[row][:n]
            hyps.append(Hypothesis(tokens_l[row][: n - 1 if fin else n], float(sum(lps)), lps, fin))
        out.append(hyps)
    return out
