"""Knowledge distillation from a trained teacher run (``edgecap train ... --teacher RUN``).

- **word level** (Hinton et al. 2015; Kim & Rush 2016 §3.1): on the same teacher-forced prefixes, the student also
  matches the teacher's token distribution at temperature ``T``:
  ``(1 − α)·CE(ground truth) + α·T²·KL(p_teacher^T ‖ p_student^T)`` per non-pad position. The models return
  log-probabilities; tempering them (``log_softmax(logp / T)``) equals tempering the logits, since a softmax is
  shift-invariant. It needs the teacher's vocabulary: the student is built on it.
- **sequence level** (Kim & Rush 2016 §3.2): the teacher's beam caption of every training image joins that image's
  ground-truth captions, so the loop samples it like a human one. This is the form that suits mask-predict students
  (LaBERT), whose refine passes do not align with an autoregressive teacher's steps.

The teacher's captions are decoded once and cached in the student's run directory
(:data:`CAPTION_CACHE`, keyed by the teacher's weights, beam and caption length); a resumed or repeated run reads
them back. Word-level targets are the teacher's forward pass on the very batch the student sees (no cache can hold
every sampled caption's full distributions cheaply); the teacher runs without gradients. No library distils these
captioners (caches, radix vocabularies, mask-predict), so the losses are written here with torch's primitives.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from edgecap.runtime._io import atomic_write_json
from edgecap.workshop.training.losses import label_smoothed_nll
from edgecap.workshop.training.objectives import level_inputs

__all__ = [
    "CAPTION_CACHE",
    "KD_MODES",
    "DistillationError",
    "Distiller",
    "Teacher",
    "distillation_record",
    "kd_loss",
    "kd_objective",
    "load_checked_teacher",
    "load_teacher",
    "make_distiller",
    "teacher_captions",
    "word_kd_objective",
]

KD_MODES = ("word", "sequence", "both")
CAPTION_CACHE = "kd_teacher_captions.json"


class DistillationError(ValueError):
    """A distillation request that cannot run: no such teacher, incompatible features or vocabularies."""


class Teacher:
    """A trained run used as teacher: its eval-mode model, vocabulary, config and weights' SHA-256."""

    def __init__(self, path: Path, model: Any, vocab: Any, config: dict[str, Any], sha256: str) -> None:
        self.path, self.model, self.vocab, self.config, self.sha256 = path, model, vocab, config, sha256

    @property
    def name(self) -> str:
        return str(self.config["model"]["name"])


def load_teacher(path: str | Path, feature_dim: int, device: torch.device | str = "cpu") -> Teacher:
    """Load the teacher run; it must have been trained on features of the student's width."""
    from edgecap.runtime.bundle.manifest import sha256_file
    from edgecap.workshop.runs import load_run

    try:
        run = load_run(path)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise DistillationError(f"--teacher {path}: not a trained run ({exc})") from exc
    width = run.config["model"].get("feature_dim")
    if width is not None and int(width) != int(feature_dim):
        raise DistillationError(
            f"--teacher {path} was trained on {width}-wide features, the student's are {feature_dim}-wide: distil "
            "from a teacher trained on the same feature cache"
        )
    sha = sha256_file(run.path / "weights.safetensors")
    return Teacher(run.path.resolve(), run.model.to(device).eval(), run.vocab, run.config, sha)


def kd_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    targets: torch.Tensor,
    pad_id: int,
    temperature: float,
    alpha: float,
    smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, nll)``: ``(1 − α)·`` label-smoothed NLL ``+ α·T²·`` mean KL(teacher ‖ student) at temperature T over
    the non-pad target positions. ``student``/``teacher``: (B, T, V) log-probabilities; the T² keeps the soft term's
    gradients on the hard term's scale (Hinton et al. 2015 §2)."""
    hard, nll = label_smoothed_nll(student, targets, pad_id, smoothing)
    s = F.log_softmax(student / temperature, dim=-1)
    t = F.log_softmax(teacher / temperature, dim=-1)
    kl = (t.exp() * (t - s)).sum(dim=-1)
    mask = targets.ne(pad_id)
    soft = (kl * mask).sum() / mask.sum().clamp(min=1)
    return (1.0 - alpha) * hard + alpha * temperature**2 * soft, nll


def word_kd_objective(teacher: Any, temperature: float, alpha: float) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The teacher-forced cross-entropy objective (``objectives.cross_entropy``) with the word-level KD term."""

    def objective(
        model: Any, visual: Any, tokens: torch.Tensor, pad_id: int, cfg: Any, tokens_per_word: int = 1
    ) -> tuple[torch.Tensor, ...]:
        per_image = cfg.captions_per_image
        mask = visual.mask.repeat_interleave(per_image, dim=0)
        memory = model.encode_memory(visual.features, visual.boxes, visual.mask).repeat_interleave(per_image, dim=0)
        levels = level_inputs(model, tokens, pad_id, tokens_per_word)
        student = model.decode_full(memory, mask, tokens[:, :-1], **levels)
        with torch.no_grad():
            t_memory = teacher.encode_memory(visual.features, visual.boxes, visual.mask)
            t_levels = level_inputs(teacher, tokens, pad_id, tokens_per_word)
            t_logprobs = teacher.decode_full(
                t_memory.repeat_interleave(per_image, dim=0), mask, tokens[:, :-1], **t_levels
            )
        return kd_loss(
            student.float(), t_logprobs.float(), tokens[:, 1:], pad_id, temperature, alpha, cfg.label_smoothing
        )

    return objective


def teacher_captions(
    teacher: Teacher,
    source: Any,
    image_ids: Sequence[str],
    run_dir: Path,
    *,
    beam: int,
    max_words: int,
    device: torch.device | str = "cpu",
) -> dict[str, list[str]]:
    """Image id -> the teacher's beam caption (as words), decoded once and cached in ``run_dir``."""
    import json

    from edgecap.workshop.torch_runtime.captioning import caption_bank
    from edgecap.workshop.training.batches import FeatureBank

    key = {"teacher": str(teacher.path), "teacher_sha256": teacher.sha256, "beam": beam, "max_words": max_words}
    cache = run_dir / CAPTION_CACHE
    if cache.is_file():
        stored = json.loads(cache.read_text())
        if {k: stored.get(k) for k in key} == key and set(image_ids) <= set(stored.get("captions", {})):
            return {i: stored["captions"][i].split() for i in image_ids}
    bank = FeatureBank(source, list(image_ids))
    texts = caption_bank(teacher.model, bank, teacher.vocab, beam_size=beam, max_words=max_words, device=device)
    captions = dict(zip(bank.image_ids, texts, strict=True))
    atomic_write_json(cache, {**key, "captions": captions})
    return {i: captions[i].split() for i in image_ids}


def distillation_record(teacher: Teacher, cfg: Any) -> dict[str, Any]:
    """The run config's ``compression`` step of a distilled run."""
    return {
        "kind": "distillation",
        "teacher": str(teacher.path),
        "teacher_model": teacher.name,
        "mode": cfg.kd_mode,
        "temperature": cfg.kd_temperature,
        "alpha": cfg.kd_alpha,
        "beam": cfg.kd_beam,
        "cache": CAPTION_CACHE if cfg.kd_mode in ("sequence", "both") else None,
    }


@dataclasses.dataclass
class Distiller:
    """What distillation adds to the training loop: the word-level objective, the teacher's captions, the config
    record."""

    objective: Callable[..., tuple[torch.Tensor, ...]] | None
    captions: dict[str, list[str]]
    record: dict[str, Any]


def load_checked_teacher(cfg: Any, feature_dim: int, device: torch.device | str = "cpu") -> Teacher:
    """Check a training config's distillation settings and load its teacher run; nothing is written, so the loop
    calls it before it creates the student's run directory."""
    from edgecap.runtime.decoding.config import MAX_BEAM

    if cfg.kd_mode not in KD_MODES:
        raise DistillationError(f"kd_mode must be one of {list(KD_MODES)}, got {cfg.kd_mode!r}")
    numbers = (cfg.kd_temperature, cfg.kd_alpha)
    if not (all(math.isfinite(x) for x in numbers) and cfg.kd_temperature > 0 and 0 <= cfg.kd_alpha <= 1):
        raise DistillationError(
            f"need a finite kd_temperature > 0 and 0 <= kd_alpha <= 1, got {cfg.kd_temperature} and {cfg.kd_alpha}"
        )
    if not 1 <= cfg.kd_beam <= MAX_BEAM:
        raise DistillationError(f"need 1 <= kd_beam <= {MAX_BEAM}, got {cfg.kd_beam}")
    return load_teacher(cfg.teacher, feature_dim, device)


def kd_objective(cfg: Any, model: Any, teacher: Teacher) -> Callable[..., tuple[torch.Tensor, ...]] | None:
    """The word-level KD objective (None for sequence-level only), once student and teacher suit ``cfg.kd_mode``."""
    from edgecap.workshop.training.objectives import cross_entropy, objective_for

    autoregressive = objective_for(teacher.model) is cross_entropy
    if cfg.kd_mode != "word" and not autoregressive:
        raise DistillationError("sequence-level distillation needs an autoregressive teacher (beam captions)")
    if cfg.kd_mode == "sequence":
        return None
    if objective_for(model) is not cross_entropy:
        raise DistillationError(
            f"{cfg.model} does not train with teacher-forced cross-entropy (LaBERT's mask-predict), so "
            "word-level distillation does not apply: use --kd-mode sequence"
        )
    if not autoregressive:
        raise DistillationError("word-level distillation needs an autoregressive teacher (its token distributions)")
    return word_kd_objective(teacher.model, cfg.kd_temperature, cfg.kd_alpha)


def make_distiller(
    cfg: Any,
    teacher: Teacher,
    objective: Callable[..., tuple[torch.Tensor, ...]] | None,
    source: Any,
    records: Sequence[Any],
    run_dir: Path,
    device: torch.device | str = "cpu",
) -> Distiller:
    """The checked request's distiller: the teacher's captions for sequence-level KD (decoded once, cached in
    ``run_dir``), the objective and the config record."""
    captions: dict[str, list[str]] = {}
    if cfg.kd_mode != "word":
        ids = [r.image_id for r in records]
        captions = teacher_captions(teacher, source, ids, run_dir, beam=cfg.kd_beam, max_words=cfg.max_words,
                                    device=device)  # fmt: skip
    return Distiller(objective, captions, distillation_record(teacher, cfg))
