"""Data-parallel measurement with ``torch.distributed``: split the sequences, merge the sums.

Launch the same command once per process, e.g.::

    torchrun --nproc-per-node 8 -m jaxroll measure MODEL_DIR --texts T --length 2048 --samples 1000 --out O

torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``; `init` joins the process group from them (gloo on the
CPU, NCCL when the model is on CUDA). Rank r of K measures the contiguous
block r of K near-equal blocks of the S sequences
(``numpy.array_split(range(S), K)[r]``), checkpoints its own partial sums
to ``checkpoint.rank{r}-of-{K}.npz`` after every sequence (``--resume``
continues each rank from its own file), and at the end `gather_to_rank0`
sends every rank's sums to rank 0, which adds sums and counts (never means
of means) and copies per-sequence rows from the rank that measured them.
Rank 0 alone writes the outputs.

The merged result equals one process's up to the order of float64
additions (``(s_0 + s_1) + (s_2 + s_3)`` instead of ``((s_0 + s_1) + s_2) +
s_3``): a relative difference of a few 1e-16.
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["World", "init", "gather_to_rank0", "broadcast_error", "checkpoint_name", "finalize"]


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place: ``rank`` of ``size`` processes, ``local_rank`` on its node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def from_environment() -> World:
    """The `World` that torchrun's environment variables describe (one process without them)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    return World(rank=int(os.environ["RANK"]), size=size, local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def init(world: World, device: str) -> None:
    """Join the process group (``env://``): NCCL for a CUDA model, gloo otherwise."""
    import torch
    import torch.distributed as dist

    if not world.distributed or dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(backend=backend, rank=world.rank, world_size=world.size)


def checkpoint_name(world: World) -> str:
    """``checkpoint.npz`` for one process, ``checkpoint.rank{r}-of-{K}.npz`` for rank r of K."""
    return "checkpoint.npz" if not world.distributed else f"checkpoint.rank{world.rank}-of-{world.size}.npz"


def broadcast_error(world: World, message: str | None) -> str | None:
    """Rank 0's error message (or None) on every rank, so that all ranks stop together."""
    if not world.distributed:
        return message
    import torch.distributed as dist

    holder = [message]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_to_rank0(world: World, sums):
    """Every rank's `PartialSums` merged on rank 0 (returned there); None on the others."""
    if not world.distributed:
        return sums
    import torch.distributed as dist

    state = sums.state()
    gathered = [None] * world.size if world.is_main else None
    dist.gather_object(state, gathered, dst=0)
    if not world.is_main:
        return None
    return sums.merge(gathered[1:])


def barrier(world: World) -> None:
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def finalize(world: World) -> None:
    """Leave the process group (after a last barrier, so that rank 0's files exist for all)."""
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
