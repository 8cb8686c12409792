"""The COCO caption metrics through pycocoevalcap: BLEU-1..4, METEOR, ROUGE-L, CIDEr-D and SPICE.

Numbers reported by captioning papers come from the COCO caption toolkit (pycocoevalcap, ACORT §5 footnote 3):
captions are tokenised by Stanford's PTBTokenizer (lower-cased, punctuation tokens dropped) and then scored by
its scorers. We call those scorers unchanged, so the numbers match the toolkit's. What we add:

* input checking: ids on one side only are named, empty captions are scored;
* line-safe tokenisation: the tokenizer works line by line and the toolkit only replaces ``"\n"``, so a ``"\r"``,
  ``"\v"`` or ``"\u2028"`` inside a caption silently shifts every later caption onto the wrong image there. We
  flatten every line break, check the output line count, run one JVM for predictions and references together
  through stdin (nothing written into the installed package) with an explicit UTF-8 encoding;
* honest unavailability: METEOR without Java and SPICE without its CoreNLP 3.6.0 jars are reported as ``None``
  with a reason, never as 0, and SPICE's jar download is never triggered;
* a ``tokenizer="simple"`` mode (lower-case, punctuation stripped) for machines without Java.

Java is needed by the PTB tokenizer, METEOR and SPICE (not by BLEU, ROUGE-L, CIDEr-D).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import warnings
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from edgecap.runtime.text import clean_caption
from edgecap.workshop.evaluation._inputs import CaptionInputError, check_inputs
from edgecap.workshop.evaluation.report import EvalResult
from edgecap.workshop.evaluation.stats import caption_stats

__all__ = [
    "METRICS",
    "MissingJavaError",
    "TokenizerError",
    "evaluate_captions",
    "java_executable",
    "ptb_tokenize",
    "simple_tokenize",
    "spice_unavailable_reason",
]

#: An image id keying predictions and references (one type for both mappings of a call).
ImageId = TypeVar("ImageId", bound=Hashable)

METRICS = ("bleu", "meteor", "rouge", "cider", "spice")
TOKENIZERS = ("ptb", "simple", "auto")

_JAVA_INSTALL_HINT = (
    "install a Java runtime, e.g. `sudo apt-get install default-jre-headless` on Debian/Ubuntu (any Java >= 8 works)"
)
_SPICE_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
# Python's str.splitlines() separators; the tokenizer works line by line, so none may survive inside a caption.
_LINE_BREAKS = re.compile("[\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_PTB_CLASS = "edu.stanford.nlp.process.PTBTokenizer"
_DISPLAY = {"bleu": "BLEU", "meteor": "METEOR", "rouge": "ROUGE-L", "cider": "CIDEr-D", "spice": "SPICE"}


class MissingJavaError(FileNotFoundError):
    """No ``java`` executable on PATH, but the PTB tokenizer (or METEOR / SPICE) needs one."""


class TokenizerError(RuntimeError):
    """The PTB tokenizer process failed or returned output that does not line up with its input."""


def java_executable() -> str | None:
    """Path of the ``java`` pycocoevalcap would run, or ``None`` when there is none on PATH."""
    return shutil.which("java")


def _require_java(purpose: str) -> str:
    java = java_executable()
    if java is None:
        raise MissingJavaError(
            f"{purpose} runs on Java, but no `java` executable is on PATH: {_JAVA_INSTALL_HINT}. "
            "Without Java, pass tokenizer='simple' to evaluate_captions to score BLEU, ROUGE-L and CIDEr-D "
            "(METEOR and SPICE are then reported unavailable)."
        )
    return java


def _module_dir(module: str) -> Path:
    import importlib

    return Path(importlib.import_module(module).__file__).resolve().parent  # type: ignore[arg-type]


def spice_unavailable_reason() -> str | None:
    """Why SPICE cannot run here, or ``None`` when it can (Java plus the CoreNLP 3.6.0 jars are present).

    pycocoevalcap downloads the jars from nlp.stanford.edu the first time ``Spice()`` is built; we only look for
    them, so an offline machine never stalls on that download.
    """
    lib = _module_dir("pycocoevalcap.spice.spice") / "lib"
    missing = [name for name in _SPICE_JARS if not (lib / name).is_file()]
    if missing:
        return (
            f"SPICE needs Stanford CoreNLP 3.6.0 ({' and '.join(missing)} missing in {lib}); copy both jars from "
            "stanford-corenlp-full-2015-12-09.zip there to enable it"
        )
    if java_executable() is None:
        return f"SPICE runs on Java and no `java` is on PATH: {_JAVA_INSTALL_HINT}"
    return None


def _single_line(caption: str) -> str:
    return _LINE_BREAKS.sub(" ", caption).strip()


def ptb_tokenize(captions: Sequence[str]) -> list[str]:
    """Tokenise captions exactly as pycocoevalcap's ``PTBTokenizer`` does, in one JVM run.

    Each caption is lower-cased and split by Stanford's PTBTokenizer (CoreNLP 3.4.1, shipped with pycocoevalcap);
    punctuation tokens are dropped and the rest joined by single spaces.

    Args:
        captions: raw captions.

    Returns:
        One tokenised string per caption; ``""`` for a caption with no words.

    Raises:
        MissingJavaError: no ``java`` on PATH.
        TokenizerError: the tokenizer failed or its output has a different number of lines.
    """
    from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS, STANFORD_CORENLP_3_4_1_JAR

    java = _require_java("The COCO PTB tokenizer")
    texts = [_single_line(c) for c in captions]
    todo = [i for i, text in enumerate(texts) if text]
    out = [""] * len(texts)
    if not todo:
        return out
    jar = _module_dir("pycocoevalcap.tokenizer.ptbtokenizer") / STANFORD_CORENLP_3_4_1_JAR
    cmd = [java, "-cp", str(jar), _PTB_CLASS, "-preserveLines", "-lowerCase", "-encoding", "utf-8"]
    proc = subprocess.run(cmd, input="\n".join(texts[i] for i in todo).encode("utf-8"), capture_output=True)
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise TokenizerError(f"PTBTokenizer exited with status {proc.returncode}: {stderr}")
    # One output line per input line, each ended by a newline (Windows: CRLF; rstrip() below drops the CR).
    lines = proc.stdout.decode("utf-8").removesuffix("\n").split("\n")
    if len(lines) != len(todo):
        raise TokenizerError(f"PTBTokenizer returned {len(lines)} lines for {len(todo)} captions")
    punctuation = set(PUNCTUATIONS)
    for i, line in zip(todo, lines, strict=True):
        out[i] = " ".join(w for w in line.rstrip().split(" ") if w not in punctuation)
    return out


def simple_tokenize(caption: str) -> str:
    """Java-free tokenisation: :func:`edgecap.runtime.text.clean_caption` words joined by spaces."""
    return " ".join(clean_caption(caption))


def _metric_list(metrics: Iterable[str] | str) -> list[str]:
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    out: list[str] = []
    for name in names:
        key = str(name).lower()
        if key not in METRICS:
            raise CaptionInputError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")
        if key not in out:
            out.append(key)
    return out


Scores = dict[str, tuple[float, list[float]]]  # metric name -> (corpus score, per-image scores)
Texts = dict[str, list[str]]


def _bleu(gts: Texts, res: Texts) -> Scores:
    from pycocoevalcap.bleu.bleu import Bleu

    corpus, per_image = Bleu(4).compute_score(gts, res, verbose=0)
    return {f"BLEU-{n + 1}": (float(corpus[n]), [float(x) for x in per_image[n]]) for n in range(4)}


def _rouge(gts: Texts, res: Texts) -> Scores:
    from pycocoevalcap.rouge.rouge import Rouge

    corpus, per_image = Rouge().compute_score(gts, res)
    return {"ROUGE-L": (float(corpus), [float(x) for x in per_image])}


def _cider(gts: Texts, res: Texts) -> Scores:
    from pycocoevalcap.cider.cider import Cider

    corpus, per_image = Cider().compute_score(gts, res)
    return {"CIDEr-D": (float(corpus), [float(x) for x in per_image])}


def _meteor(gts: Texts, res: Texts) -> Scores:
    from pycocoevalcap.meteor.meteor import Meteor

    scorer = Meteor()
    try:
        corpus, per_image = scorer.compute_score(gts, res)
    finally:
        # Stop the JVM now rather than whenever the garbage collector runs Meteor.__del__.
        with scorer.lock, contextlib.suppress(OSError):
            scorer.meteor_p.stdin.close()
        scorer.meteor_p.kill()
        scorer.meteor_p.wait()
    return {"METEOR": (float(corpus), [float(x) for x in per_image])}


def _spice(gts: Texts, res: Texts) -> Scores:
    from pycocoevalcap.spice.spice import Spice

    corpus, per_image = Spice().compute_score(gts, res)
    by_id = dict(zip(sorted(gts), per_image, strict=True))  # Spice returns images in sorted id order
    return {"SPICE": (float(corpus), [float(by_id[key]["All"]["f"]) for key in gts])}


def _resolve_tokenizer(tokenizer: str, notes: list[str]) -> str:
    if tokenizer not in TOKENIZERS:
        raise CaptionInputError(f"unknown tokenizer {tokenizer!r}; choose from {', '.join(TOKENIZERS)}")
    if tokenizer == "auto":
        if java_executable() is not None:
            return "ptb"
        notes.append("no `java` on PATH: used the simple tokenizer instead of PTB, numbers differ slightly from COCO's")
        return "simple"
    return tokenizer


def evaluate_captions(
    predictions: Mapping[ImageId, str | Sequence[str]],
    references: Mapping[ImageId, Sequence[str | Sequence[str]]],
    *,
    train_captions: Iterable[str | Sequence[str]] | None = None,
    metrics: Iterable[str] | str = METRICS,
    tokenizer: str = "ptb",
) -> EvalResult:
    """Score generated captions with the COCO caption toolkit, plus caption statistics.

    Args:
        predictions: image id -> one generated caption (a string, or its word tokens).
        references: image id -> reference captions (strings or word tokens); same ids as ``predictions``.
        train_captions: the training set's captions, for the uniqueness statistic (ACORT Table 3).
        metrics: any of ``"bleu"`` (BLEU-1..4), ``"meteor"``, ``"rouge"`` (ROUGE-L), ``"cider"`` (CIDEr-D),
            ``"spice"``.
        tokenizer: ``"ptb"`` (the toolkit's, needs Java), ``"simple"`` (lower-case, punctuation stripped, no
            Java), or ``"auto"`` (PTB when Java is present).

    Returns:
        An :class:`EvalResult`. METEOR (no Java) and SPICE (no Java or no CoreNLP 3.6.0 jars) are ``None`` with
        a reason in ``unavailable`` when they cannot run; they are never reported as 0.

    Raises:
        CaptionInputError: ids present on one side only (named), empty input, malformed captions, unknown
            metric or tokenizer names.
        MissingJavaError: ``tokenizer="ptb"`` and no ``java`` on PATH.
        TokenizerError: the PTB tokenizer failed.
    """
    wanted = _metric_list(metrics)
    notes: list[str] = []
    tokenizer = _resolve_tokenizer(tokenizer, notes)
    ids, preds, refs = check_inputs(predictions, references)
    keys = [str(i) for i in ids]  # scorers get string ids: SPICE writes them to JSON and sorts them

    flat = [preds[i] for i in ids] + [r for i in ids for r in refs[i]]
    tokenised = ptb_tokenize(flat) if tokenizer == "ptb" else [simple_tokenize(t) for t in flat]
    res = {key: [tokenised[j]] for j, key in enumerate(keys)}
    gts: Texts = {}
    cursor = len(keys)
    for key, i in zip(keys, ids, strict=True):
        gts[key] = tokenised[cursor : cursor + len(refs[i])]
        cursor += len(refs[i])

    stats = caption_stats([preds[i] for i in ids], train_captions)  # before the slow scorers: fail fast
    empty = sum(not res[key][0] for key in keys)
    if empty:
        notes.append(f"{empty} of {len(keys)} predictions are empty after tokenisation; they score 0")
    if "cider" in wanted and len(keys) == 1:
        notes.append(
            "CIDEr-D needs a corpus: its IDF comes from the evaluated set's references, so a single image scores 0"
        )

    scores: dict[str, float | None] = {}
    per_image: dict[str, tuple[float, ...]] = {}
    unavailable: dict[str, str] = {}
    for metric in wanted:
        computed, reason, failed = _run_metric(metric, gts, res)
        if failed:
            notes.append(reason)
        if computed is None:
            for name in _metric_names(metric):
                scores[name] = None
                unavailable[name] = reason
            continue
        for name, (corpus, values) in computed.items():
            scores[name] = corpus
            per_image[name] = tuple(values)

    for note in notes:
        warnings.warn(note, UserWarning, stacklevel=2)
    return EvalResult(
        scores=scores,
        unavailable=unavailable,
        stats=stats,
        num_images=len(keys),
        tokenizer=tokenizer,
        image_ids=tuple(keys),
        per_image=per_image,
        warnings=tuple(notes),
    )


_RUNNERS: dict[str, Callable[[Texts, Texts], Scores]] = {
    "bleu": _bleu,
    "meteor": _meteor,
    "rouge": _rouge,
    "cider": _cider,
    "spice": _spice,
}


def _metric_names(metric: str) -> list[str]:
    return [f"BLEU-{n}" for n in range(1, 5)] if metric == "bleu" else [_DISPLAY[metric]]


def _run_metric(metric: str, gts: Texts, res: Texts) -> tuple[Scores | None, str, bool]:
    """(scores, "", False), or (None, why not, whether it failed while running).

    A Java scorer (METEOR, SPICE) that fails while running is reported unavailable, so that the other metrics
    survive a JVM crash; a failure of the pure-Python scorers is a bug and propagates.
    """
    reason = _unavailable_reason(metric)
    if reason is not None:
        return None, reason, False
    try:
        return _RUNNERS[metric](gts, res), "", False
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        if metric not in ("meteor", "spice"):
            raise
        return None, f"{_DISPLAY[metric]} failed: {type(exc).__name__}: {exc}", True


def _unavailable_reason(metric: str) -> str | None:
    if metric == "meteor" and java_executable() is None:
        return f"METEOR runs on Java and no `java` is on PATH: {_JAVA_INSTALL_HINT}"
    if metric == "spice":
        return spice_unavailable_reason()
    return None
