"""torchrun / torch.distributed for every heavy stage: the one module that knows about ranks.

A stage calls :func:`setup` first. Launched by ``torchrun`` (or anything that sets the same
variables: SLURM with ``srun torchrun``, Kubernetes' PyTorchJob, ``accelerate launch``), it joins
the process group that ``WORLD_SIZE`` / ``RANK`` / ``LOCAL_RANK`` / ``MASTER_ADDR`` describe —
NCCL on GPUs, gloo on CPUs. Launched plainly, it is a world of one and every helper here is a
no-op, so a stage has one code path whatever the world size:

* :func:`shard` — this rank's share of a list (``items[rank::world]``);
* :func:`all_reduce_sum` — sum tensors over ranks, in place;
* :func:`gather_rows` — concatenate every rank's rows (uneven counts allowed), optionally
  keeping the autograd graph so that in-batch negatives from other ranks pass gradients back;
* :func:`broadcast` / :func:`gather_objects` — Python objects (decisions, logs, checkpoints);
* rank-0 artifacts live in :func:`synthq.artifacts.on_main.artifact_on_main` (the artifact layer may
  import this module, never the reverse): only rank 0 creates the artifact; the others get a
  scratch writer that is thrown away, and every rank leaves the block when rank 0 has finished.

Privacy: DP stages draw their Poisson batch and their Gaussian noise from secret generators
that rank 0 seeds and broadcasts (:class:`synthq.dp.noise.SecretRandomness`). Each rank clips
its own share of the batch; the clipped sums are all-reduced; every rank then adds the *same*
noise vector once to that global sum. The update is therefore exactly the single-process update
(noise once per logical step, not once per rank), the replicas stay identical without further
communication, and the accountant sees the global sampling rate ``q = batch / n``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Topology:
    """Where this process sits: ``rank`` of ``world_size``, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict:
        return {"world_size": self.world_size, "backend": self.backend}


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _group():
    """``torch.distributed`` when this process has joined a process group, else None.

    Nothing can have joined one before torch was imported, so a process that never imported
    torch (``synthq --help``, ``info``, ``ledger``) is a world of one without paying the second
    it takes to import it.
    """
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def topology() -> Topology:
    """The current process' place in the process group (a world of one when there is none)."""
    dist = _group()
    if dist is not None:
        return Topology(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=_env_int("LOCAL_RANK", 0),
            backend=str(dist.get_backend()),
        )
    return Topology()


def setup(device: str = "auto", threads: int | None = None) -> Topology:
    """Join the process group torchrun describes, once (idempotent); a world of one otherwise.

    ``device`` picks the backend: NCCL when the stage runs on CUDA, gloo on CPU (``--device cpu``
    under torchrun gives CPU ranks, which is how the tests run two ranks on one machine).
    It also sets torch's CPU thread count: the node's cores shared by its ranks, unless
    ``threads`` / ``SYNTHQ_THREADS`` / ``OMP_NUM_THREADS`` say otherwise (:mod:`synthq.runtime.threads`),
    and makes the C heap keep freed memory for the next step (:mod:`synthq.runtime.malloc`).
    """
    import torch
    import torch.distributed as dist

    from synthq.runtime.malloc import keep_freed_memory
    from synthq.runtime.threads import configure_threads

    configure_threads(threads)
    keep_freed_memory()
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size > 1 and dist.is_available() and not dist.is_initialized():
        use_cuda = torch.cuda.is_available() and device in ("auto", "cuda") or device.startswith("cuda:")
        if use_cuda:
            torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        if dist.get_rank() != 0:
            from synthq.runtime.console import follow_main_process

            follow_main_process()
    return topology()


def leave(completed: bool = True) -> None:
    """Leave the process group, if this process joined one, before the interpreter shuts down.

    A gloo group left to the interpreter's teardown can abort the process (``terminate called
    without an active exception``: its worker threads still hold work objects when C++ statics are
    destroyed), turning a finished stage into a SIGABRT. Leaving a gloo group is local, so it is
    done on every exit; an NCCL group is only left after the work ``completed``, because aborting
    its communicators while a peer still waits in a collective can hang that peer.
    """
    dist = _group()
    if dist is None:
        return
    if completed or str(dist.get_backend()) == "gloo":
        dist.destroy_process_group()


def resolve_device(choice: str = "auto") -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; anything else is passed through
    (``--device`` values are checked when the config is read: :func:`synthq.config.fields.check_device`)."""
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_for(choice: str = "auto") -> str:
    """The torch device of this rank: ``auto`` -> ``cuda:LOCAL_RANK`` when GPUs are visible."""
    choice = resolve_device(choice)
    if choice == "cuda" and topology().world_size > 1:
        return f"cuda:{topology().local_rank}"
    return choice


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: every ``world_size``-th item from position ``rank``."""
    place = topology()
    return list(items[place.rank :: place.world_size])


def _to_backend(tensor: torch.Tensor) -> torch.Tensor:
    """NCCL moves CUDA tensors only; gloo takes CPU (and CUDA) tensors as they are."""
    if topology().backend == "nccl" and not tensor.is_cuda:
        return tensor.to(f"cuda:{topology().local_rank}")
    return tensor


def all_reduce_sum(tensors: Sequence[torch.Tensor]) -> None:
    """Sum every tensor over all ranks, in place (one flattened collective)."""
    if topology().world_size == 1 or not tensors:
        return
    import torch
    import torch.distributed as dist

    flat = _to_backend(torch.cat([t.reshape(-1) for t in tensors]))
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for tensor in tensors:
        tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor).to(tensor.device))
        offset += tensor.numel()


def gather_rows(tensor: torch.Tensor, with_grad: bool = False) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order.

    Ranks may hold different numbers of rows (the last batch of an epoch rarely divides evenly):
    each pads to the largest count, gathers, and drops the padding. With ``with_grad`` the
    result stays in the autograd graph (``torch.distributed.nn.all_gather``): a loss computed on
    it sends gradients back to the rank that produced each row.
    """
    if topology().world_size == 1:
        return tensor
    import torch
    import torch.distributed as dist

    home = tensor.device
    tensor = _to_backend(tensor)
    counts = [None] * topology().world_size
    dist.all_gather_object(counts, int(tensor.shape[0]))
    largest = max(counts)
    padded = tensor
    if tensor.shape[0] < largest:
        filler = tensor.new_zeros((largest - tensor.shape[0], *tensor.shape[1:]))
        padded = torch.cat([tensor, filler])
    if with_grad:
        import torch.distributed.nn as dist_nn

        pieces = list(dist_nn.all_gather(padded))
    else:
        pieces = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(pieces, padded.contiguous())
    return torch.cat([piece[:count] for piece, count in zip(pieces, counts, strict=True)]).to(home)


def broadcast(value: T, source: int = 0) -> T:
    """``value`` as held by rank ``source``, on every rank (any picklable object)."""
    if topology().world_size == 1:
        return value
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=source)
    return holder[0]


def gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if topology().world_size == 1:
        return [value]
    import torch.distributed as dist

    values = [None] * topology().world_size
    dist.all_gather_object(values, value)
    return values


def mean_over_ranks(values: Sequence[float]) -> float:
    """The mean of all ranks' ``values`` together (NaN when nobody has any)."""
    everything = [v for part in gather_objects(list(values)) for v in part]
    return sum(everything) / len(everything) if everything else float("nan")


def on_main(function, *args, **kwargs):
    """``function(*args, **kwargs)`` run on rank 0 only, its result handed to every rank (for
    decisions that must agree, such as "this artifact is up to date, skip the stage")."""
    return broadcast(function(*args, **kwargs) if topology().is_main else None)


def broadcast_parameters(module: torch.nn.Module, source: int = 0) -> None:
    """Make every rank's copy of ``module`` equal to rank ``source``'s (parameters and buffers)."""
    if topology().world_size == 1:
        return
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=source)


def barrier() -> None:
    if topology().world_size > 1:
        import torch.distributed as dist

        dist.barrier()
