"""Scale-out with PyTorch's own engine: launch with ``torchrun`` (single or multi-node), DDP or FSDP.

``torchrun --nproc_per_node N -m vitkit train ...`` (or ``--nnodes``/``--rdzv-endpoint`` for several
machines) sets RANK / WORLD_SIZE / LOCAL_RANK; :func:`setup` then joins the process group with NCCL on
GPUs and gloo on CPUs. Only rank 0 writes files.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device asks for CUDA but no GPU is visible: use train.device=cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device(f"cuda:{local_rank}")
    return dev


def setup(device: str = "auto") -> Dist:
    """Join the torchrun process group if launched by torchrun, else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend=backend)
    return Dist(rank, world, local, dev)


def teardown() -> None:
    """Leave the process group. A trainer and its DDP/FSDP-wrapped model sit in reference cycles (hooks), so they
    outlive the caller's last reference until a garbage collection; collected only at interpreter shutdown, the
    wrapper releases the gloo group's pending work while Python is half torn down, which can abort the process
    ("terminate called without an active exception", seen on a torchrun rank after a finished FSDP run). So the
    caller drops its trainer and this collects before destroying the group."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def wrap(model: nn.Module, d: Dist, kind: str = "ddp") -> nn.Module:
    """DDP (replicated weights, all-reduced gradients) or FSDP (weights, gradients and optimiser state
    sharded per block; for models that do not fit one device)."""
    if not d.enabled:
        return model
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # each block, then the ViT (also when an objective wraps it: its forward may call the ViT alone),
        # then the whole module
        inner = next((m for m in model.modules() if hasattr(m, "blocks")), model)
        for blk in getattr(inner, "blocks", []):
            fully_shard(blk)
        if inner is not model:
            fully_shard(inner)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def all_reduce_mean(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= d.world
    return t


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def all_reduce_max(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """The element-wise maximum over the processes (``t`` itself when not distributed)."""
    if d.enabled:
        t = t.to(d.device).clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        t = t.cpu()
    return t


def full_state(model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None):
    """Full (unsharded, CPU) model and optimiser state dicts, for DDP, FSDP or a plain module."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optimizer is None:
        return get_model_state_dict(model, options=opts), None
    return get_state_dict(model, optimizer, options=opts)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A whole tensor on the CPU: an FSDP shard (DTensor) gathered (collective), a plain tensor detached."""
    return t.full_tensor().cpu() if hasattr(t, "full_tensor") else t.detach().cpu()


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state, optim_state) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=opts)
