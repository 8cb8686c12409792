"""The files SCST adds to a run directory: the cross-entropy weights (and backbone) it started from, its resumable
state and summary, and the copy of a trained run it can start in (:func:`init_from_run`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from edgecap.runtime._io import atomic_path
from edgecap.workshop.training import checkpoint as ckpt
from edgecap.workshop.training.distributed import Dist

__all__ = ["SCST_STATE", "SCST_SUMMARY", "XE_BACKBONE", "XE_WEIGHTS", "init_from_run"]

SCST_STATE = Path("checkpoints") / "scst"
XE_BACKBONE = "backbone.xe.safetensors"
SCST_SUMMARY = "scst.json"
XE_WEIGHTS = "weights.xe.safetensors"


def init_from_run(init: str | Path, out: str | Path) -> Path:
    """Copy a trained run's config, vocabulary and best weights into ``out`` (created), for SCST there.

    A directory that already holds a run (e.g. an interrupted SCST run being resumed) is left as it is.
    """
    init, out = Path(init), Path(out)
    ckpt.read_config(init)  # a clear error when INIT is not a run
    if out.resolve() == init.resolve() or (out / ckpt.CONFIG).is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for name in (ckpt.VOCAB, ckpt.WEIGHTS, "backbone.safetensors", ckpt.CONFIG):  # config last: marks a full copy
        if (init / name).is_file():
            with atomic_path(out / name) as tmp:
                shutil.copyfile(init / name, tmp)
    return out


def _open_backbone(run_dir: Path, config: dict[str, Any], state: dict[str, Any] | None, ctx: Dist) -> Any:
    """The run's fine-tuned backbone for end-to-end SCST: from the resumed state, else from its weights file."""
    from edgecap.workshop.torch_runtime.images import backbone_from_spec
    from edgecap.workshop.training.end_to_end import BACKBONE_WEIGHTS

    source = run_dir / (XE_BACKBONE if (run_dir / XE_BACKBONE).is_file() else BACKBONE_WEIGHTS)
    spec = config["backbone"]
    backbone = backbone_from_spec(spec, weights=source) if source.name == BACKBONE_WEIGHTS else None
    if backbone is None:  # restarting before the first checkpoint: the backbone SCST started from
        from edgecap.workshop.models.backbone import create_backbone

        backbone = create_backbone(spec["name"], weights=source, image_size=int(spec["image_size"]))
    if state is not None:
        backbone.model.load_state_dict(state["backbone"])
    elif ctx.is_main and not (run_dir / XE_BACKBONE).is_file():
        with atomic_path(run_dir / XE_BACKBONE) as tmp:
            shutil.copyfile(run_dir / BACKBONE_WEIGHTS, tmp)
    for p in backbone.parameters():
        p.requires_grad_(True)
    return backbone


def _save_backbone(run_dir: Path, backbone: Any) -> None:
    """Write the backbone's weights and point ``config.json`` at them (config last: a crash keeps the old pair)."""
    from safetensors.torch import save_file

    from edgecap.workshop.models.backbone import create_backbone
    from edgecap.workshop.training.end_to_end import BACKBONE_WEIGHTS

    with atomic_path(run_dir / BACKBONE_WEIGHTS) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in backbone.model.state_dict().items()}, str(tmp))
    config = ckpt.read_config(run_dir)
    spec = config["backbone"]
    tuned = create_backbone(spec["name"], weights=run_dir / BACKBONE_WEIGHTS, image_size=int(spec["image_size"]))
    config["backbone"] = tuned.spec
    ckpt.write_config(run_dir, config)
