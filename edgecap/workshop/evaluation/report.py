"""The result of a caption evaluation, and its JSON / markdown / rich-table forms.

Scores are stored on pycocoevalcap's scale (BLEU, METEOR, ROUGE-L, SPICE in 0..1; CIDEr-D about 0..10). Papers
print them multiplied by 100 (e.g. "B-4 38.7, C 125.0"), so the readable formats do too, by default. A metric that
could not be computed is ``None`` with a reason, never 0, so that a missing Java or SPICE model is never mistaken
for a bad captioner.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from edgecap.runtime._io import atomic_write_text
from edgecap.workshop.evaluation._inputs import CaptionInputError
from edgecap.workshop.evaluation.stats import CaptionStats

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["METRIC_NAMES", "EvalResult", "format_markdown", "format_table", "print_result"]

# Display order; also the keys of ``EvalResult.scores``.
METRIC_NAMES = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D", "SPICE")


def _json_float(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


@dataclass(frozen=True)
class EvalResult:
    """Scores of one set of generated captions.

    Attributes:
        scores: metric name (see ``METRIC_NAMES``) -> corpus score, ``None`` when unavailable.
        unavailable: metric name -> why it could not be computed (exactly the metrics whose score is ``None``).
        stats: uniqueness, length and vocabulary statistics of the captions.
        num_images: number of evaluated images.
        tokenizer: ``"ptb"`` (the COCO toolkit's Stanford PTBTokenizer) or ``"simple"``.
        image_ids: the evaluated images, as strings, in evaluation order (may be empty when loaded from a summary).
        per_image: metric name -> per-image scores aligned with ``image_ids``.
        warnings: conditions that make the numbers less meaningful (single image, empty captions, ...).
    """

    scores: Mapping[str, float | None]
    unavailable: Mapping[str, str]
    stats: CaptionStats
    num_images: int
    tokenizer: str
    image_ids: tuple[str, ...] = ()
    per_image: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        scores = {str(k): (None if v is None else float(v)) for k, v in self.scores.items()}
        unavailable = {str(k): str(v) for k, v in self.unavailable.items()}
        no_reason = sorted(k for k, v in scores.items() if v is None and k not in unavailable)
        if no_reason:
            raise CaptionInputError(f"metric(s) {', '.join(no_reason)} have no score and no reason why")
        stray = sorted(k for k in unavailable if k not in scores or scores[k] is not None)
        if stray:
            raise CaptionInputError(
                f"metric(s) {', '.join(stray)} have an 'unavailable' reason but a score or no entry"
            )
        image_ids = tuple(str(i) for i in self.image_ids)
        if image_ids and len(image_ids) != self.num_images:
            raise CaptionInputError(f"{len(image_ids)} image ids given for num_images={self.num_images}")
        per_image = {str(k): tuple(float(x) for x in v) for k, v in self.per_image.items()}
        wrong = sorted(k for k, v in per_image.items() if not image_ids or len(v) != len(image_ids))
        if wrong:
            raise CaptionInputError(
                f"per-image scores of {', '.join(wrong)} do not match the {len(image_ids)} image ids"
            )
        object.__setattr__(self, "scores", MappingProxyType(scores))
        object.__setattr__(self, "unavailable", MappingProxyType(unavailable))
        object.__setattr__(self, "image_ids", image_ids)
        object.__setattr__(self, "per_image", MappingProxyType(per_image))
        object.__setattr__(self, "warnings", tuple(str(w) for w in self.warnings))

    def __getitem__(self, metric: str) -> float | None:
        """The corpus score of ``metric`` (``None`` if unavailable).

        Raises:
            KeyError: the metric was not requested.
        """
        if metric not in self.scores:
            raise KeyError(f"metric {metric!r} was not evaluated; evaluated: {', '.join(self.scores)}")
        return self.scores[metric]

    def to_dict(self, *, per_image: bool = False) -> dict[str, Any]:
        """A JSON-ready dict; ``per_image=True`` adds the image ids and per-image scores. NaN becomes ``None``."""
        out: dict[str, Any] = {
            "num_images": self.num_images,
            "tokenizer": self.tokenizer,
            "metrics": {k: _json_float(v) for k, v in self.scores.items()},
            "unavailable": dict(self.unavailable),
            "stats": self.stats.to_dict(),
            "warnings": list(self.warnings),
        }
        if per_image:
            out["image_ids"] = list(self.image_ids)
            out["per_image"] = {k: [_json_float(x) for x in v] for k, v in self.per_image.items()}
        return out

    def to_json(self, *, per_image: bool = False, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(per_image=per_image), indent=indent, allow_nan=False)

    def save(self, path: str | Path, *, per_image: bool = True) -> None:
        """Write :meth:`to_json` to ``path`` atomically."""
        atomic_write_text(path, self.to_json(per_image=per_image) + "\n")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalResult:
        """Inverse of :meth:`to_dict` (with or without per-image scores).

        Raises:
            CaptionInputError: a required field is missing or inconsistent.
        """
        required = ("num_images", "tokenizer", "metrics", "unavailable", "stats")
        missing = [k for k in required if k not in data]
        if missing:
            raise CaptionInputError(f"evaluation result lacks field(s) {', '.join(missing)}")
        unavailable = dict(data["unavailable"])
        # A NaN score was written as null; it has no "unavailable" reason, so read it back as NaN.
        scores = {k: (math.nan if v is None and k not in unavailable else v) for k, v in dict(data["metrics"]).items()}
        per_image = {k: tuple(math.nan if x is None else x for x in v) for k, v in data.get("per_image", {}).items()}
        return cls(
            scores=scores,
            unavailable=unavailable,
            stats=CaptionStats.from_dict(dict(data["stats"])),
            num_images=int(data["num_images"]),
            tokenizer=str(data["tokenizer"]),
            image_ids=tuple(data.get("image_ids", ())),
            per_image=per_image,
            warnings=tuple(data.get("warnings", ())),
        )

    @classmethod
    def load(cls, path: str | Path) -> EvalResult:
        """Read a result written by :meth:`save`.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            CaptionInputError: the file is not a valid evaluation result (the message names it).
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise CaptionInputError(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise CaptionInputError(f"{path}: expected a JSON object, got {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except (CaptionInputError, TypeError, ValueError) as exc:
            raise CaptionInputError(f"{path}: {exc}") from exc


def _ordered(result: EvalResult) -> list[str]:
    known = [m for m in METRIC_NAMES if m in result.scores]
    return known + [m for m in result.scores if m not in METRIC_NAMES]


def _score_text(result: EvalResult, metric: str, scale: float, digits: int) -> str:
    value = result.scores[metric]
    if value is None:
        return "n/a"
    return "nan" if math.isnan(value) else f"{value * scale:.{digits}f}"


def _notes(result: EvalResult) -> list[str]:
    """Why metrics are missing, then the warnings: printed under the tables, where long text fits."""
    return [f"{m} unavailable: {reason}" for m, reason in result.unavailable.items()] + [
        f"warning: {w}" for w in result.warnings
    ]


def _stat_rows(result: EvalResult) -> list[tuple[str, str]]:
    s = result.stats
    rows = [
        ("images", str(result.num_images)),
        ("average length (words)", f"{s.avg_length:.2f}"),
        ("vocabulary used (words)", str(s.vocab_size)),
        ("distinct captions (%)", f"{s.distinct:.1f}"),
        (
            "unique: not in training set (%)",
            "n/a (no training captions given)" if s.uniqueness is None else f"{s.uniqueness:.1f}",
        ),
    ]
    if s.empty:
        rows.append(("empty captions", str(s.empty)))
    rows.append(("tokenizer", result.tokenizer))
    return rows


def format_markdown(result: EvalResult, *, scale: float = 100.0, digits: int = 1) -> str:
    """Two markdown tables (metrics, then caption statistics), then why metrics are n/a and any warnings.

    Args:
        result: the evaluation.
        scale: factor applied to the scores (100: the papers' convention; 1: pycocoevalcap's raw numbers).
        digits: decimals shown for the scores.
    """
    unit = "" if scale == 1 else f" (×{scale:g})"
    lines = [f"| metric | score{unit} |", "|---|---:|"]
    lines += [f"| {m} | {_score_text(result, m, scale, digits)} |" for m in _ordered(result)]
    lines += ["", "| caption statistic | value |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in _stat_rows(result)]
    notes = _notes(result)
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def format_table(result: EvalResult, *, scale: float = 100.0, digits: int = 1, title: str | None = None) -> Table:
    """A rich table of the metrics and caption statistics (see :func:`format_markdown` for the arguments)."""
    from rich.table import Table
    from rich.text import Text

    # Text objects, not markup strings: reasons and warnings may contain "[...]" (paths, lists).
    unit = "" if scale == 1 else f" (×{scale:g})"
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column(f"score{unit}", justify="right")
    for metric in _ordered(result):
        style = "dim" if result.scores[metric] is None else ""
        table.add_row(Text(metric), Text(_score_text(result, metric, scale, digits), style=style))
    table.add_section()
    for name, value in _stat_rows(result):
        table.add_row(Text(name), Text(value))
    notes = _notes(result)
    if notes:
        table.caption = Text("\n".join(notes), style="yellow", justify="left")
    return table


def print_result(result: EvalResult, *, console: Console | None = None, **kwargs: Any) -> None:
    """Print :func:`format_table` to ``console`` (default: a new stdout console)."""
    from rich.console import Console

    (console or Console()).print(format_table(result, **kwargs))
