"""Greedy decoding, and the row-wise loop greedy and sampling share.

Each row (one per image, or ``n`` per image when sampling) is an independent hypothesis. The first step runs on the
B encoded images only — all of an image's rows would see the same BOS — and the state is expanded to B·n rows after
it. A row that emits EOS is finished: with ``prune_finished`` it is dropped from the batch with ``select`` (fewer rows
per step); without it the row keeps being fed PAD at full batch size (fixed shapes) and its outputs are ignored.

Per step the loop runs the processors (one masked copy when they are static, see
:class:`~edgecap.runtime.decoding.processors.ProcessorPlan`; for greedy one biased add, checked for NaN on the chosen
log-probs), picks one token per row (:meth:`Search.choose`: for greedy a single ``argmax``), and turns the chosen
tokens into a list once to find EOS. Tokens and log-probs are kept per step and assembled into hypotheses at the end;
``select`` runs only when rows are expanded or pruned. The radix cap (a step where only EOS is legal: no whole word
fits before ``max_len``) is not run: the rows still going end there unfinished, as the reference's ``_sample`` stops
at ``seq_length`` without an EOS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgecap.runtime.decoding.config import DecodeCfg
from edgecap.runtime.decoding.processors import LogitsProcessor, processor_plan
from edgecap.runtime.decoding.protocol import Hypothesis, StepModel, as_logprobs, batch_size_of
from edgecap.runtime.decoding.search import GreedySearch, Search


def decode_rows(
    step_model: StepModel,
    inputs: Mapping[str, Any],
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
    procs = None if processors is None else list(processors)
    eos, max_len = cfg.eos_id, cfg.max_len
    state = step_model.encode(inputs)
    images = batch_size_of(state)
    total = images * rows_per_image
    plan = None

    rows = list(range(total))  # output row of each live row
    ended = [False] * total
    n_ended = 0
    pad_mask: np.ndarray | None = None  # without pruning: live rows already ended (fed PAD)
    steps: list[tuple[list[int], list[int], np.ndarray | list[float]]] = []  # per step: rows, tokens, their log-probs
    live_tokens = np.full(images, cfg.bos_id, dtype=np.int64)
    history = np.empty((images, 0), dtype=np.int64)  # kept only if a processor reads it
    for t in range(max_len):
        if plan is not None and plan.only_token(t) == eos:  # the radix cap: live rows end as they stand, no EOS
            break
        lp, state = step_model.step(live_tokens, state)
        lp = as_logprobs(lp, live_tokens.shape[0])
        if t == 0 and rows_per_image > 1:
            expand = np.repeat(np.arange(images, dtype=np.int64), rows_per_image)
            state = step_model.select(state, expand)
            lp, history = lp[expand], history[expand]
        if plan is None:
            plan = processor_plan(cfg, procs, lp.shape[1])
        if search.reveals_nan:
            processed, biased = plan.biased(lp, t, history)
            tokens, token_lps = search.choose(t, processed)
            chosen_lps = token_lps.tolist()
            if biased and _has_nan(chosen_lps):  # a NaN/+inf under a mask: redo this step with exact masking
                tokens, token_lps = search.choose(t, plan(lp, t, history))
                chosen_lps = token_lps.tolist()
        else:
            tokens, token_lps = search.choose(t, plan(lp, t, history))
            chosen_lps = token_lps
        chosen = tokens.tolist()
        steps.append((rows, chosen, chosen_lps))

        eos_rows = [j for j, tok in enumerate(chosen) if tok == eos and not ended[rows[j]]] if eos in chosen else []
        for j in eos_rows:
            ended[rows[j]] = True
        n_ended += len(eos_rows)
        if t == max_len - 1 or n_ended == total:
            break
        if plan.needs_history:
            history = np.concatenate([history, tokens[:, None]], axis=1)
        if cfg.prune_finished:
            if eos_rows:
                dropped = set(eos_rows)
                keep_l = [j for j in range(len(rows)) if j not in dropped]
                keep = np.asarray(keep_l, dtype=np.int64)
                state = step_model.select(state, keep)
                rows, tokens = [rows[j] for j in keep_l], tokens[keep]
                if plan.needs_history:
                    history = history[keep]
            live_tokens = tokens
        else:
            if eos_rows:
                pad_mask = np.asarray(ended, dtype=bool)
            live_tokens = tokens if pad_mask is None else np.where(pad_mask, cfg.pad_id, tokens)

    return _collect(steps, total, eos, images, rows_per_image)


def _has_nan(values: list[float]) -> bool:
    total = sum(values)  # NaN propagates (as does +inf + -inf, a harmless false alarm)
    return total != total


def _collect(
    steps: list[tuple[list[int], list[int], np.ndarray | list[float]]],
    total: int,
    eos_id: int,
    images: int,
    rows_per_image: int,
) -> list[list[Hypothesis]]:
    """Assemble each output row's tokens up to and including its first EOS (later outputs of a row fed PAD are not
    part of it)."""
    tokens: list[list[int]] = [[] for _ in range(total)]
    logprobs: list[list[float]] = [[] for _ in range(total)]
    ended = [False] * total
    for rows, chosen, lps_t in steps:
        lps_l = lps_t.tolist() if isinstance(lps_t, np.ndarray) else lps_t
        for row, tok, lp in zip(rows, chosen, lps_l, strict=True):
            if ended[row]:
                continue
            tokens[row].append(tok)
            logprobs[row].append(lp)
            ended[row] = tok == eos_id
    out: list[list[Hypothesis]] = []
    for image in range(images):
        hyps = []
        for row in range(image * rows_per_image, (image + 1) * rows_per_image):
            toks, lps, fin = tokens[row], logprobs[row], ended[row]
            hyps.append(Hypothesis(toks[:-1] if fin else toks, float(sum(lps)), lps, fin))
        out.append(hyps)
    return out


def greedy(
    step_model: StepModel,
    inputs: Mapping[str, Any],
    cfg: DecodeCfg,
    processors: Sequence[LogitsProcessor] | None = None,
) -> list[list[Hypothesis]]:
    """Greedy decoding: the most likely token at every step.

    Args:
        step_model: any :class:`StepModel`.
        inputs: encoder inputs with batch B.
        cfg: token ids, ``max_len``, ``min_len``, processors, ``prune_finished``.
        processors: replaces the processors ``cfg`` would build.

    Returns:
        B lists of one :class:`Hypothesis` each.
    """
    return decode_rows(step_model, inputs, cfg, GreedySearch(), 1, processors)
