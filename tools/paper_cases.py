"""Random-init models at the papers' settings, exported for the thread studies (``research/onnxruntime_threads.py``,
``research/thread_crossover.py``): the forced decode of each model, its graphs and inputs written for worker
processes, and how a study prints and saves its table. torch and the workshop half (``[train]``) are imported inside
the functions, so importing it stays cheap."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from tools.files import write_json, write_text

__all__ = ["PAPER_CASES", "PAPER_WORDS", "decode_cfg", "run_and_report", "write_case"]

#: model -> (regions per image, forced decode length in tokens): ACORT decodes 2 radix tokens per word (13 words),
#: ExpansionNet v2 words; regions as the papers' features (36 bottom-up boxes; a 12 × 12 Swin-L grid).
PAPER_CASES = {"acort-xsmall": (36, 26), "expansionnet-v2": (144, 19)}
PAPER_WORDS = 10_000  # the COCO word vocabulary (without <unk>), which radix tokens encode in base 768


def decode_cfg(model: str, beam: int, steps: int) -> dict[str, Any]:
    """``DecodeCfg`` fields of a beam search forced to ``steps`` tokens, with the model's token layout (radix digits
    for ACORT), as JSON for the workers."""
    from edgecap.workshop.models import get_model_cfg

    cfg = get_model_cfg(model)
    fields: dict[str, Any] = {"strategy": "beam" if beam > 1 else "greedy", "beam_size": beam}
    fields.update(max_len=steps, min_len=steps - 1, pad_id=0)
    if cfg.vocab_kind == "radix":
        base = cfg.radix_base
        digits = 1
        while base**digits < PAPER_WORDS:
            digits += 1
        fields.update(bos_id=base + 1, eos_id=base + 2, radix=[base, digits, PAPER_WORDS])
    else:
        fields.update(bos_id=1, eos_id=2, radix=None)
    return fields


def write_case(model_name: str, batches: Sequence[int], seed: int, beam: int, where: Path) -> int:
    """The FP32 runtime graphs of a random-init model at the paper settings, encoder inputs per batch size and the
    decoding settings, written to ``where`` for the workers; returns the step graph's size in bytes."""
    import torch

    from edgecap.workshop.export import export_onnx
    from edgecap.workshop.export.spec import get_export_spec
    from edgecap.workshop.models import create_model, paper_settings

    torch.manual_seed(seed)
    model = create_model(model_name, **paper_settings(model_name)).eval()
    graphs = export_onnx(model, None, precisions=["fp32"], parity=False).runtime_models("fp32")
    for role, graph in graphs.items():
        (where / f"{role}.onnx").write_bytes(graph.SerializeToString())
    spec = get_export_spec(model)
    encoder = spec.graph(spec.runtime_graphs["encoder"])
    regions = PAPER_CASES[model_name][0]
    for batch in batches:
        made = encoder.make_inputs({"batch": batch, "regions": regions, "past": 0}, torch.Generator().manual_seed(seed))
        arrays: dict[str, Any] = {name: made[name].numpy() for name in spec.decode_inputs}
        np.savez(where / f"inputs_{batch}.npz", **arrays)
    (where / "decode.json").write_text(json.dumps(decode_cfg(model_name, beam, PAPER_CASES[model_name][1])))
    return (where / "step.onnx").stat().st_size


def run_and_report(
    args: SimpleNamespace,
    measure: Callable[[SimpleNamespace, Path], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    stem: str,
) -> int:
    """Run ``measure`` in a scratch folder (torch on one thread: the export's work only, the sessions get their own
    threads), print ``render``'s table and, with ``--out``, write ``STEM.json`` and ``STEM.md`` there."""
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix=stem.replace("_", "-") + "-") as scratch:
        result = measure(args, Path(scratch))
    table = render(result)
    print(table)
    if args.out is not None:
        write_json(args.out / f"{stem}.json", result)
        write_text(args.out / f"{stem}.md", table)
    return 0
