"""The measurement driver: every bundle × runtime × precision × beam × batch (× length level) combination of a
:class:`~edgecap.bench.config.BenchCfg`.

Order of work (``docs/bench-report-schema.md`` describes every number):

1. in this process: capture the environment, open and verify each bundle, resolve the quality subset and the input
   pool, and list the combinations that cannot exist here (``skipped``, with the reason);
2. per bundle × runtime × precision (a *group*): :func:`~edgecap.bench.measure.measure_group`, by default in a fresh
   Python process (``BenchCfg.isolate``; :mod:`edgecap.bench.worker`), so a group's memory and load time are its own
   and a crash or out-of-memory kill in one group is recorded as an error and the run goes on;
3. link the results (:mod:`edgecap.bench.linking`): speed-up against the prefix re-run baseline, quality delta
   against FP32; add the methodology notes (:mod:`edgecap.bench.notes`).
"""

from __future__ import annotations

import datetime
from typing import Any

from edgecap.bench.config import ALL_LEVELS, BenchCfg, BenchCfgError
from edgecap.bench.linking import RERUN, link_results
from edgecap.bench.measure import GroupTask
from edgecap.bench.notes import report_notes
from edgecap.bench.progress import ProgressBar
from edgecap.bench.results import SCHEMA_VERSION, BenchReport, BundleInfo, ComboResult, Skip
from edgecap.bench.worker import run_in_process, run_isolated
from edgecap.runtime.precisions import PRECISIONS

__all__ = ["ALL_LEVELS", "PRECISIONS", "RERUN", "BenchCfg", "BenchCfgError", "link_results", "run_benchmark"]


def _bundle_info(bundle: Any, quality_set: str | None, quality_note: str | None) -> BundleInfo:
    from edgecap.bench.compression import bundle_compression
    from edgecap.bench.subjects import bundle_input_kind, bundle_run_id

    spec = bundle.backbone_spec
    return BundleInfo(
        path=str(bundle.path),
        name=bundle.name,
        family=bundle.manifest.get("model", {}).get("family"),
        parameters=bundle.manifest.get("model", {}).get("parameters"),
        precisions=list(bundle.precisions),
        input=bundle_input_kind(bundle),
        backbone=(
            f"{spec.get('name')} {'in the encoder graph' if bundle.backbone_in_graph else 'in torch'}" if spec else None
        ),
        variants=bundle.summary(),
        quality_set=quality_set,
        quality_note=quality_note,
        run=bundle_run_id(bundle),
        **bundle_compression(bundle.manifest, list(bundle.precisions)),
    )


def run_benchmark(cfg: BenchCfg, progress: bool = True, *, command: str | None = None) -> BenchReport:
    """Measure every combination of ``cfg`` and return the report (write it with
    :func:`~edgecap.bench.report.write_report`).

    Raises:
        BenchCfgError: bad configuration.
        edgecap.runtime.length.LengthLevelError: length levels asked of a bundle without length control.
        edgecap.runtime.bundle.BundleError: a bundle is missing, corrupt or inconsistent (checked before any timing).
        FileNotFoundError, ValueError: ``images``/``quality_data`` given but unusable.
    """
    from edgecap.bench.environment import capture_environment
    from edgecap.bench.subjects import bundle_input_kind, list_images, resolve_quality_set, skip_reason
    from edgecap.runtime.bundle import load_bundle

    environment = capture_environment()
    if cfg.threads is not None:
        environment["threads_requested"] = cfg.threads
    image_paths = tuple(str(p) for p in list_images(cfg.images, cfg.max_images)) if cfg.images else None
    bundles, tasks, skipped = [], [], []
    for path in cfg.bundles:
        bundle = load_bundle(path, verify=True, graphs="none")
        levels, beyond = cfg.levels_for(bundle)  # first: a level the bundle cannot take is refused before any work
        quality_set, quality_text = None, None
        if cfg.quality and cfg.quality_images > 0:
            quality_set, quality_text = resolve_quality_set(
                bundle, cfg.quality_data, cfg.quality_features, cfg.quality_images
            )
        else:
            quality_text = "quality measurement switched off"
        bundles.append(
            _bundle_info(bundle, quality_text if quality_set else None, None if quality_set else quality_text)
        )
        beams = (1,) if bundle.decoding == "mask_predict" else (cfg.beams or (bundle.beam,))
        precisions = cfg.precisions or bundle.precisions
        if image_paths is not None and bundle_input_kind(bundle) == "features":
            for runtime in cfg.runtimes:
                for precision in precisions:
                    skipped.append(
                        Skip(str(bundle.path), runtime, precision, "--images: this bundle captions region features")
                    )
            continue
        for runtime in cfg.runtimes:
            for precision in precisions:
                reason = skip_reason(runtime, precision, bundle, cfg.device)
                if reason is None and not levels:
                    reason = "; ".join(beyond)
                if reason is not None:
                    skipped.append(Skip(str(bundle.path), runtime, precision, reason))
                    continue
                skipped.extend(Skip(str(bundle.path), runtime, precision, why) for why in beyond)
                tasks.append(
                    GroupTask(
                        str(bundle.path), bundle.name, runtime, precision, beams, cfg, image_paths, quality_set, levels
                    )
                )

    results: list[ComboResult] = []
    errors: list[Skip] = []
    units = sum(len(t.beams) * len(t.levels) * (len(cfg.batches) + (t.quality_set is not None)) for t in tasks)
    with ProgressBar(units, enabled=progress) as bar:
        for task in tasks:
            outcome = run_isolated(task, bar) if cfg.isolate else run_in_process(task, bar)
            results.extend(outcome.results)
            errors.extend(outcome.errors)
    results = link_results(results)
    return BenchReport(
        schema_version=SCHEMA_VERSION,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        config=cfg.to_dict(),
        environment=environment,
        bundles=bundles,
        results=results,
        skipped=skipped,
        errors=errors,
        notes=report_notes(cfg, results, bundles),
        command=command,
    )
