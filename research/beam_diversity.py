"""Table 4's "BS" baseline: diversity (Div-1, Div-2, SelfCIDEr) of the top-4 beams of an autoregressive run.

LaBERT §4.6 compares the captions a length-aware model writes at its 4 levels with the 4 best beams of the original
model (beam size 4). ``edgecap eval RUN --length-level all`` reports the former; this script the latter.

Usage::

    python -m research.beam_diversity RUN --data DATASET --features FEATURES --split test --out FILE.json
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import torch

from edgecap.runtime.captioning import decode_cfg_for
from edgecap.runtime.decoding import decode
from edgecap.workshop.evaluation.length import diversity
from edgecap.workshop.runs import load_run
from edgecap.workshop.torch_runtime.captioning import decoder_for
from tools.files import write_json


@click.command(help=__doc__.splitlines()[0])
@click.argument("run")
@click.option("--data", required=True)
@click.option("--features", required=True)
@click.option("--split", default="test", show_default=True)
@click.option("--beam", type=int, default=4, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True)
def main(**options: Any) -> None:
    args = SimpleNamespace(**options)
    torch.set_num_threads(1)

    from edgecap.workshop.data.datasets import load_dataset
    from edgecap.workshop.data.sources import open_feature_source
    from edgecap.workshop.training.batches import FeatureBank

    trained = load_run(args.run)
    records = load_dataset(args.data).split(args.split)
    bank = FeatureBank(open_feature_source(args.features), [r.image_id for r in records])
    cfg = decode_cfg_for(trained.vocab, beam_size=args.beam, max_words=trained.max_words, n_best=args.beam)
    decoder = decoder_for(trained.model)
    sets: dict[str, list[str]] = {}
    for start in range(0, len(bank), 50):
        rows = list(range(start, min(start + 50, len(bank))))
        hyps = decode(decoder, bank.batch(rows).as_inputs(), cfg)
        for row, beams in zip(rows, hyps, strict=True):
            sets[bank.image_ids[row]] = [" ".join(trained.vocab.decode(h.tokens)) for h in beams]
    result = {"run": str(trained.path), "split": args.split, "beam": args.beam, "images": len(sets), **diversity(sets)}
    print(result)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
