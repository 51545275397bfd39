"""Helpers of the integration tests: a free loopback port, and a forked rank's environment."""

from __future__ import annotations

import os
import socket
import sys


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def become_rank(rank: int, world: int, port: int) -> None:
    """In a forked rank: the variables torchrun sets, and none of the parent's Accelerate state.

    Accelerate keeps its process state in class-level singletons; a rank forked from a test
    process that already ran a one-process Accelerator or Trainer would inherit "one process".
    And the parent's intra-op threads are not in the child: compute there on one thread.
    """
    import torch

    torch.set_num_threads(1)  # a thread pool the parent started does not survive the fork
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), NODE_RANK="0", OMP_NUM_THREADS="1")
    reset_accelerate()


def reset_accelerate() -> None:
    """Forget Accelerate's process, accelerator and gradient state, if Accelerate was imported."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()
