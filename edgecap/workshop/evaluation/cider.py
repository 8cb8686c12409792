"""Fast CIDEr-D: the COCO caption toolkit's CIDEr, vectorised with numpy.

CIDEr-D (Vedantam et al., CVPR 2015, §3 and §5 "CIDEr-D") scores a candidate against the references of its image by
the cosine similarity of TF-IDF weighted n-gram vectors (n = 1..4), where

* the IDF of an n-gram is ``log(N) - log(max(1, df))``, ``df`` being the number of *documents* (images) whose
  references contain it and ``N`` the number of documents;
* the candidate's weights are clipped by the reference's (``min(g_c, g_r) * g_r`` in the numerator);
* each candidate/reference pair is damped by ``exp(-delta^2 / (2 sigma^2))``, sigma = 6, with ``delta`` the length
  difference;
* the per-n similarities are averaged over n and over the references, and multiplied by 10.

pycocoevalcap's ``Cider`` class *is* CIDEr-D; this module reproduces its ``CiderScorer`` number for number (including
its quirk of measuring ``delta`` in bigram counts, ``max(len - 1, 0)``). The document frequencies come either from the
references being scored (the COCO evaluation protocol; a one-image set then scores 0) or, as self-critical training
does with the training captions, from a reference corpus given once to ``CiderD(refs_corpus)`` and reused for every
batch.

How it is fast: words become integer ids once; an n-gram's id is derived from the id of its (n-1)-gram prefix and
its last word, level by level, with ``np.unique`` / ``np.searchsorted`` on int64 keys, so there are no Python tuples
per n-gram. Each sentence becomes a sparse vector of (n-gram id, count) entries and every candidate/reference
similarity is a handful of ``np.bincount`` reductions over those entries.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TypeVar, cast

import numpy as np

from edgecap.runtime.text import clean_caption
from edgecap.workshop.evaluation._inputs import CaptionInputError, check_inputs

__all__ = ["CiderD", "cider_d"]

# An n-gram key is ``prefix_id * _KEY_BASE + word_id``; ids stay far below 2**31, so keys fit in int64.
_KEY_BASE = np.int64(1 << 32)

Tokens = Sequence[Hashable]
#: An image id keying predictions and references (one type for both mappings of a call).
ImageId = TypeVar("ImageId", bound=Hashable)


@dataclass(frozen=True)
class _Level:
    """The n-grams of one order seen in the reference corpus: sorted keys (id = position) and their DF."""

    keys: np.ndarray  # (G_n,) int64, sorted, unique
    df: np.ndarray  # (G_n,) float64


@dataclass(frozen=True)
class _Sparse:
    """Sentences as sparse n-gram count vectors, entries sorted by (sentence, n-gram id)."""

    sentence: np.ndarray  # (E,) int64 sentence index of each entry
    gram: np.ndarray  # (E,) int64 global n-gram id (levels stacked one after the other)
    order: np.ndarray  # (E,) int64 n-gram order - 1 (0..n-1)
    count: np.ndarray  # (E,) float64 term frequency
    level_sizes: tuple[int, ...]  # number of distinct ids per order (corpus ids first, then new ones)
    lengths: np.ndarray  # (S,) int64 words per sentence


def _check_sentence(sentence: object, where: str) -> None:
    if isinstance(sentence, str | bytes) or not isinstance(sentence, Sequence):
        raise CaptionInputError(
            f"{where} must be a sequence of tokens (e.g. a list of words), got {type(sentence).__name__}; "
            "tokenise captions first (edgecap.runtime.text.clean_caption)"
        )


def _word_ids(sentences: Sequence[Tokens], vocab: dict[Hashable, int], *, grow: bool) -> np.ndarray:
    """Integer id of every token of every sentence, flattened.

    Words of ``vocab`` keep their id; other words get fresh ids from ``len(vocab)`` on, and are added to ``vocab``
    when ``grow``. Only the distinct words go through Python code; the per-token mapping runs in C.
    """
    flat = list(chain.from_iterable(sentences))
    local = dict.fromkeys(flat)
    fresh = len(vocab)
    for word in local:
        known = vocab.get(word)
        if known is None:
            known = fresh
            fresh += 1
            if grow:
                vocab[word] = known
        local[word] = known
    return np.fromiter(map(local.__getitem__, flat), dtype=np.int64, count=len(flat))


def _sparse_ngrams(
    sentences: Sequence[Tokens],
    n: int,
    vocab: dict[Hashable, int],
    corpus: Sequence[_Level] | None,
    *,
    grow: bool = False,
) -> tuple[_Sparse, list[np.ndarray]]:
    """Count the 1..n-grams of every sentence.

    With ``corpus`` the ids of n-grams seen in the corpus are their corpus ids (positions in ``corpus[k].keys``);
    n-grams never seen get ids after them. Without it, ids are positions in this batch's sorted unique keys.

    Returns:
        The sparse counts and, per order, the sorted unique keys of this batch (used to build a corpus).
    """
    lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    words = _word_ids(sentences, vocab, grow=grow)
    num_tokens = int(words.size)
    sentence_of = np.repeat(np.arange(len(sentences), dtype=np.int64), lengths)
    remaining = np.repeat(np.cumsum(lengths), lengths) - np.arange(num_tokens, dtype=np.int64)

    level_pos: list[np.ndarray] = []  # per order: token positions where an n-gram of that order starts
    level_ids: list[np.ndarray] = []  # per order: the id of the n-gram starting at each of those positions
    level_sizes: list[int] = []
    batch_keys: list[np.ndarray] = []
    prev = words  # id of the (k-1)-gram starting at each position (valid where remaining >= k-1)
    for k in range(1, n + 1):
        pos = np.flatnonzero(remaining >= k)
        keys = words[pos] if k == 1 else prev[pos] * _KEY_BASE + words[pos + k - 1]
        if corpus is None:
            uniq, ids = np.unique(keys, return_inverse=True)
            size = int(uniq.size)
            batch_keys.append(uniq)
        elif k == 1:
            ids = keys  # word ids are already corpus ids (known) or fresh ids after them
            size = max(int(corpus[0].keys.size), int(keys.max()) + 1 if keys.size else 0)
        else:
            ids, size = _lookup(corpus[k - 1].keys, keys)
        current = np.full(num_tokens, -1, dtype=np.int64)
        current[pos] = ids
        level_pos.append(pos)
        level_ids.append(ids)
        level_sizes.append(size)
        prev = current

    offsets = np.concatenate([[0], np.cumsum(level_sizes)]).astype(np.int64)
    total = int(offsets[-1])
    pieces = zip(offsets, level_pos, level_ids, strict=False)  # offsets has one more entry (the total)
    combined = np.concatenate([sentence_of[pos] * total + (offset + ids) for offset, pos, ids in pieces])
    uniq, counts = np.unique(combined, return_counts=True)
    gram = uniq % total if total else uniq
    sparse = _Sparse(
        sentence=uniq // total if total else uniq,
        gram=gram,
        order=np.searchsorted(offsets[1:], gram, side="right").astype(np.int64),
        count=counts.astype(np.float64),
        level_sizes=tuple(level_sizes),
        lengths=lengths,
    )
    return sparse, batch_keys


def _lookup(corpus_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Ids of ``keys``: their corpus position when present, fresh ids after the corpus ones otherwise."""
    pos = np.searchsorted(corpus_keys, keys)
    found = pos < corpus_keys.size
    found[found] = corpus_keys[pos[found]] == keys[found]
    ids = np.where(found, pos, -1)
    unseen = ~found
    fresh = 0
    if unseen.any():
        uniq, inverse = np.unique(keys[unseen], return_inverse=True)
        ids[unseen] = corpus_keys.size + inverse
        fresh = int(uniq.size)
    return ids.astype(np.int64), int(corpus_keys.size) + fresh


def _document_frequency(sparse: _Sparse, doc_of_sentence: np.ndarray, doc_weight: np.ndarray) -> np.ndarray:
    """Number of documents containing each n-gram; ``doc_weight`` counts a document that many times."""
    total = int(sum(sparse.level_sizes))
    if sparse.gram.size == 0:
        return np.zeros(total, dtype=np.float64)
    doc = doc_of_sentence[sparse.sentence]
    pairs = _unique(doc * total + sparse.gram)
    return np.bincount(pairs % total, weights=doc_weight[pairs // total], minlength=total).astype(np.float64)


def _unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values; sort-based, since ``np.unique``'s hash path is several times slower on int64 keys."""
    values = np.sort(values)
    keep = np.empty(values.size, dtype=bool)
    keep[:1] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def _ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + l)`` for every (s, l)."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    return np.repeat(starts - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)


class CiderD:
    """CIDEr-D scorer with document frequencies from a fixed reference corpus or from each scored set.

    Args:
        refs_corpus: the references of every image of a corpus (e.g. the training split for self-critical training,
            as the SCST code does with ``coco-train-idxs``), each image a sequence of tokenised captions. Its
            document frequencies and ``log(number of images)`` are computed once here. ``None``: use the
            references passed to each :meth:`score` call instead (the COCO evaluation protocol of pycocoevalcap).
        n: highest n-gram order (CIDEr-D uses 4).
        sigma: standard deviation of the Gaussian length penalty (CIDEr-D uses 6).

    Tokens can be any hashable (words, or vocabulary ids), as long as the corpus and the candidates use the same
    kind.

    Raises:
        ValueError: ``n < 1``, ``sigma <= 0``, or an empty corpus.
    """

    def __init__(
        self, refs_corpus: Iterable[Sequence[Tokens]] | None = None, *, n: int = 4, sigma: float = 6.0
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma!r}")
        self.n = n
        self.sigma = float(sigma)
        self._vocab: dict[Hashable, int] = {}
        self._levels: tuple[_Level, ...] | None = None
        self._num_documents: int | None = None
        if refs_corpus is not None:
            self._build_corpus(refs_corpus)

    @property
    def num_documents(self) -> int | None:
        """Number of images in the reference corpus, or ``None`` when DF comes from each scored set."""
        return self._num_documents

    def __repr__(self) -> str:
        source = "scored set" if self._levels is None else f"corpus of {self._num_documents} images"
        return f"CiderD(n={self.n}, sigma={self.sigma}, df from {source})"

    def _build_corpus(self, refs_corpus: Iterable[Sequence[Tokens]]) -> None:
        sentences: list[Tokens] = []
        doc_sizes: list[int] = []
        for i, refs in enumerate(refs_corpus):
            if isinstance(refs, str | bytes) or not isinstance(refs, Sequence):
                raise CaptionInputError(f"refs_corpus[{i}] must be a sequence of tokenised captions")
            for j, sentence in enumerate(refs):
                _check_sentence(sentence, f"refs_corpus[{i}][{j}]")
            sentences.extend(refs)
            doc_sizes.append(len(refs))
        if not doc_sizes:
            raise ValueError("refs_corpus is empty: CIDEr-D needs at least one image's references")
        sparse, batch_keys = _sparse_ngrams(sentences, self.n, self._vocab, None, grow=True)
        num_docs = len(doc_sizes)
        doc_of_sentence = np.repeat(np.arange(num_docs, dtype=np.int64), np.asarray(doc_sizes, dtype=np.int64))
        df = _document_frequency(sparse, doc_of_sentence, np.ones(num_docs))
        offsets = np.concatenate([[0], np.cumsum(sparse.level_sizes)])
        levels = []
        for k in range(self.n):
            keys = batch_keys[k]
            if k == 0:
                # Order-1 ids are the word ids themselves, so index DF by word id (every corpus word occurs).
                keys = np.arange(len(self._vocab), dtype=np.int64)
                word_df = np.zeros(len(self._vocab))
                word_df[batch_keys[0]] = df[offsets[0] : offsets[1]]
                levels.append(_Level(keys=keys, df=word_df))
            else:
                levels.append(_Level(keys=keys, df=df[offsets[k] : offsets[k + 1]]))
        self._levels = tuple(levels)
        self._num_documents = num_docs

    def score(self, candidates: Sequence[Tokens], refs: Sequence[Sequence[Tokens]]) -> np.ndarray:
        """CIDEr-D of every candidate against its references.

        Args:
            candidates: C tokenised captions.
            refs: C lists of tokenised references; ``refs[i]`` belongs to ``candidates[i]``. Several candidates of
                one image (e.g. SCST samples) may share the same list object, which is then processed once. Without
                a corpus, every entry of ``refs`` counts as one document, exactly as in pycocoevalcap.

        Returns:
            (C,) float64 scores (pycocoevalcap scale: about 0..10, 1.0 is "CIDEr 100" in papers).

        Raises:
            ValueError: lengths differ, a candidate has no references, or a caption is a str instead of tokens.
        """
        if len(candidates) != len(refs):
            raise CaptionInputError(f"got {len(candidates)} candidates but {len(refs)} reference lists")
        num_cands = len(candidates)
        if num_cands == 0:
            return np.zeros(0, dtype=np.float64)

        group_of_id: dict[int, int] = {}
        groups: list[Sequence[Tokens]] = []
        cand_group = np.empty(num_cands, dtype=np.int64)
        for i, (cand, group) in enumerate(zip(candidates, refs, strict=True)):
            _check_sentence(cand, f"candidates[{i}]")
            g = group_of_id.get(id(group))
            if g is None:
                if isinstance(group, str | bytes) or not isinstance(group, Sequence):
                    raise CaptionInputError(f"refs[{i}] must be a sequence of tokenised captions")
                if len(group) == 0:
                    raise CaptionInputError(f"refs[{i}] is empty: every candidate needs at least one reference")
                for j, sentence in enumerate(group):
                    _check_sentence(sentence, f"refs[{i}][{j}]")
                g = group_of_id[id(group)] = len(groups)
                groups.append(group)
            cand_group[i] = g

        group_sizes = np.fromiter((len(g) for g in groups), dtype=np.int64, count=len(groups))
        group_start = np.concatenate([[0], np.cumsum(group_sizes)[:-1]]).astype(np.int64)
        sentences: list[Tokens] = list(candidates)
        for group in groups:
            sentences.extend(group)
        sparse, _ = _sparse_ngrams(sentences, self.n, self._vocab, self._levels)

        if self._levels is None:
            doc_of_ref = np.repeat(np.arange(len(groups), dtype=np.int64), group_sizes)
            doc_of_sentence = np.concatenate([np.zeros(num_cands, dtype=np.int64), doc_of_ref])
            multiplicity = np.bincount(cand_group, minlength=len(groups)).astype(np.float64)
            # Candidates' own n-grams never count: give the candidate "documents" weight 0 via a dummy doc index.
            doc_of_sentence[:num_cands] = len(groups)
            df = _document_frequency(sparse, doc_of_sentence, np.append(multiplicity, 0.0))
            log_num_docs = math.log(float(num_cands))
        else:
            sizes = zip(self._levels, sparse.level_sizes, strict=True)
            df = np.concatenate([np.pad(level.df, (0, size - level.df.size)) for level, size in sizes])
            log_num_docs = math.log(float(cast(int, self._num_documents)))  # set with the corpus levels
        idf = log_num_docs - np.log(np.maximum(1.0, df))

        n = self.n
        weight = sparse.count * idf[sparse.gram]
        num_sentences = len(sentences)
        norms = np.sqrt(
            np.bincount(sparse.sentence * n + sparse.order, weights=weight**2, minlength=num_sentences * n)
        ).reshape(num_sentences, n)

        # Every (candidate, reference) pair; reference sentence indices are offset by the candidates.
        pair_cand = np.repeat(np.arange(num_cands, dtype=np.int64), group_sizes[cand_group])
        pair_ref = num_cands + _ragged_arange(group_start[cand_group], group_sizes[cand_group])
        num_pairs = int(pair_ref.size)

        entry_start = np.searchsorted(sparse.sentence, np.arange(num_sentences + 1, dtype=np.int64))
        ref_entries = _ragged_arange(entry_start[pair_ref], entry_start[pair_ref + 1] - entry_start[pair_ref])
        entry_pair = np.repeat(np.arange(num_pairs, dtype=np.int64), entry_start[pair_ref + 1] - entry_start[pair_ref])

        total = max(int(sum(sparse.level_sizes)), 1)
        num_cand_entries = int(entry_start[num_cands])
        cand_keys = sparse.sentence[:num_cand_entries] * total + sparse.gram[:num_cand_entries]
        query = pair_cand[entry_pair] * total + sparse.gram[ref_entries]
        hit = np.searchsorted(cand_keys, query)
        matched = hit < num_cand_entries
        matched[matched] = cand_keys[hit[matched]] == query[matched]
        ref_weight = weight[ref_entries[matched]]
        cand_weight = weight[hit[matched]]
        numerator = np.bincount(
            entry_pair[matched] * n + sparse.order[ref_entries[matched]],
            weights=np.minimum(cand_weight, ref_weight) * ref_weight,
            minlength=num_pairs * n,
        ).reshape(num_pairs, n)

        denominator = norms[pair_cand] * norms[pair_ref]
        nonzero = denominator != 0
        similarity = np.where(nonzero, numerator / np.where(nonzero, denominator, 1.0), numerator)
        # pycocoevalcap measures a sentence's length as its number of bigrams (the ``n == 1`` branch of counts2vec).
        bigrams = np.maximum(sparse.lengths - 1, 0) if n >= 2 else np.zeros_like(sparse.lengths)
        delta = (bigrams[pair_cand] - bigrams[pair_ref]).astype(np.float64)
        penalty = np.exp(-(delta**2) / (2.0 * self.sigma**2))
        pair_score = similarity.sum(axis=1) * penalty
        per_cand = np.bincount(pair_cand, weights=pair_score, minlength=num_cands)
        return per_cand * 10.0 / (n * group_sizes[cand_group])

    def compute_score(
        self, gts: Mapping[Hashable, Sequence[str]], res: Mapping[Hashable, Sequence[str]]
    ) -> tuple[float, np.ndarray]:
        """Drop-in for pycocoevalcap's ``Cider().compute_score(gts, res)``.

        Args:
            gts: image id -> list of tokenised references, each one space-joined string.
            res: image id -> a one-element list holding the tokenised candidate string.

        Returns:
            The corpus mean and the (num_images,) per-image scores, in the order of ``gts``.

        Raises:
            ValueError: the two mappings have different ids, or ``res`` values are not one-element lists.
        """
        if set(gts) != set(res):
            raise CaptionInputError(
                f"gts and res have different image ids ({len(set(gts) - set(res))} only in gts, "
                f"{len(set(res) - set(gts))} only in res)"
            )
        if not gts:
            raise CaptionInputError("gts and res are empty")
        candidates, refs = [], []
        for key, group in gts.items():
            hypo = res[key]
            if isinstance(hypo, str) or len(hypo) != 1:
                raise CaptionInputError(f"res[{key!r}] must be a list with exactly one caption string")
            if isinstance(group, str):
                raise CaptionInputError(f"gts[{key!r}] must be a list of caption strings, got a str")
            candidates.append(hypo[0].split())
            refs.append([ref.split() for ref in group])
        scores = self.score(candidates, refs)
        return float(scores.mean()), scores


def cider_d(
    predictions: Mapping[ImageId, str | Sequence[str]],
    references: Mapping[ImageId, Sequence[str | Sequence[str]]],
    *,
    scorer: CiderD | None = None,
) -> float:
    """Corpus CIDEr-D of captions without Java: simple tokenisation + the fast scorer (training-time validation).

    Captions are tokenised with :func:`edgecap.runtime.text.clean_caption` (lower-case, punctuation stripped), not the
    PTB tokenizer, so the number is close to but not identical with
    :func:`edgecap.workshop.evaluation.evaluate_captions`.

    Args:
        predictions: image id -> caption (a string, or its word tokens).
        references: image id -> reference captions (strings or word tokens).
        scorer: a :class:`CiderD` to use (e.g. one with corpus document frequencies); default: DF from
            ``references``, as in the COCO evaluation.

    Returns:
        The mean CIDEr-D over the images (pycocoevalcap scale).

    Raises:
        CaptionInputError: ids missing on one side, empty sets, or malformed captions.
    """
    ids, preds, refs = check_inputs(predictions, references)
    if len(ids) == 1 and (scorer is None or scorer.num_documents is None):
        warnings.warn(
            "CIDEr-D over a single image is 0: its IDF comes from the scored set's references; "
            "score the whole set at once",
            UserWarning,
            stacklevel=2,
        )
    candidates = [clean_caption(preds[key]) for key in ids]
    ref_tokens = [[clean_caption(ref) for ref in refs[key]] for key in ids]
    return float((scorer or CiderD()).score(candidates, ref_tokens).mean())
