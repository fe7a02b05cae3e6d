"""The mp executor's RPC channels: the names the ``rpc_channel`` setting takes, and the shm
channel's polling default. Shared by the settings table and the executor, so here, below both."""

from __future__ import annotations

RPC_CHANNELS = ("shm", "pipe")
DEFAULT_RPC_CHANNEL = "shm"  # the faster of the two: docs/performance.md, "RPC channel"
# Seconds a waiting side of the shm channel polls before it blocks, where every worker has a CPU
# of its own; where they do not, polling workers would take CPU from working ones.
SPIN_WITH_FREE_CPUS = 0.05
# The size of each of a worker's two reply areas in the shm channel (a reply that does not fit
# goes to a spill file): what the room rule counts as each worker's shared memory.
SHM_REPLY_BYTES = 4 * 1024 * 1024
