"""Two real processes in one gloo process group, for the tests that check one process == two."""
from __future__ import annotations

import contextlib
import multiprocessing
import os
from typing import Any, Callable, Iterator

import torch


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int) -> Iterator[None]:
    """In a worker: the process group on ``127.0.0.1:port``, destroyed on exit."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def run_on_two_processes(worker: Callable[..., None], *args: Any, base_port: int, timeout: float = 300) -> None:
    """``worker(rank, 2, port, *args)`` on two spawned processes (the port ``base_port`` plus this process's id
    modulo 1000); asserts both exit cleanly within ``timeout`` seconds."""
    port = base_port + os.getpid() % 1000
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(rank, 2, port) + args) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
