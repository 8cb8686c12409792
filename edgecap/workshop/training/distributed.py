"""Data-parallel training with ``torch.distributed``: process group, per-rank shards, DDP and rank-0-only writes.

Launch with torchrun (``torchrun --nproc-per-node N -m edgecap train ...``); torchrun sets ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` and does the rendezvous, also across machines (``--nnodes``,
``--rdzv-backend c10d --rdzv-endpoint HOST:PORT``). Without those variables training runs in one process and
nothing here talks to a process group.

- Backend: NCCL when the run trains on CUDA (each process on ``cuda:LOCAL_RANK``), gloo on CPU.
- Data: every epoch the training images are shuffled with a seed that depends only on (seed, epoch) and split
  across ranks by :class:`torch.utils.data.DistributedSampler`, which covers every image once per epoch (padding
  the last shard by repeating images so every rank runs the same number of steps).
- Gradients: :class:`torch.nn.parallel.DistributedDataParallel` averages them over ranks. Each rank's loss is the
  mean over its own batch, so N processes with ``--batch-size B`` train on a global batch of N·B images at the
  learning rate given; the same global batch (``B = B_1 / N``) gives the one-process training curve within noise.
- Writes: rank 0 alone validates and writes checkpoints, logs and summaries; the other ranks wait at a barrier.
  Every rank resumes from the same checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Dist", "ObjectiveModule", "epoch_order", "init_distributed", "shutdown", "wrap_ddp"]


@dataclass(frozen=True)
class Dist:
    """This process's place in the job; ``world == 1`` means no process group."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def agree(self, flag: bool) -> bool:
        """Rank 0's value of ``flag`` on every rank (e.g. a wall-clock stop, which must not differ between ranks)."""
        if not self.active:
            return flag
        value = torch.tensor([int(flag)], dtype=torch.int64, device=_collective_device())
        dist.broadcast(value, src=0)
        return bool(value.item())

    def mean(self, value: float) -> float:
        """The mean of a float over ranks (for logging a running reward or loss of the global batch)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=_collective_device())
        dist.all_reduce(t)
        return float(t.item()) / self.world


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def init_distributed(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group torchrun describes in the environment (a no-op without ``WORLD_SIZE`` > 1).

    Returns:
        This process's :class:`Dist` and its device: ``cuda:LOCAL_RANK`` for a CUDA run, ``device`` otherwise.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=rank, local_rank=local_rank, world=world), device


def epoch_order(num_items: int, seed: int, epoch: int, ctx: Dist) -> list[int]:
    """This rank's item indices for ``epoch``: a (seed, epoch) shuffle, sharded by ``DistributedSampler``.

    One process keeps the permutation the single-process loop has always used, so its runs are unchanged.
    """
    if not ctx.active:
        gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
        return torch.randperm(num_items, generator=gen).tolist()
    from torch.utils.data import DistributedSampler

    sampler: DistributedSampler[int] = DistributedSampler(
        range(num_items),  # type: ignore[arg-type]  # a Sized index range is all the sampler reads; torch types a Dataset num_replicas=ctx.world, rank=ctx.rank, shuffle=True, seed=seed, drop_last=False
    )
    sampler.set_epoch(epoch)
    return list(sampler)


class ObjectiveModule(nn.Module):
    """Runs an objective function on the wrapped model inside ``forward``, so DDP sees the whole training
    computation (the objectives call ``encode_memory``/``decode_full``, not the model's ``forward``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, objective: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return objective(self.model, *args, **kwargs)


def wrap_ddp(model: nn.Module, ctx: Dist) -> Callable[..., Any]:
    """``call(objective, *args)`` -> ``objective(model, *args)``, through DDP when the job has several ranks.

    ``find_unused_parameters=True``: some families leave parameters out of a step (e.g. length embeddings of
    levels absent from a batch), which plain DDP would treat as an error.
    """
    wrapper = ObjectiveModule(model)
    if not ctx.active:
        return wrapper
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(wrapper, find_unused_parameters=True)


def shutdown(ctx: Dist) -> None:
    """Leave the process group (the end of a torchrun job)."""
    if ctx.active and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
