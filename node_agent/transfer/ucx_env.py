"""UCX's environment: the one place that decides UCX's settings, set before ucxx loads (in the agent's
process by Ray's env_vars, or by ucx_transport.import_ucxx). Apart from the transport so that whoever
creates an agent actor (the router, `up`) reads it without loading torch and ucxx."""

DEFAULT_ENV = {"UCXPY_PROGRESS_MODE": "blocking", "UCX_WARN_UNUSED_ENV_VARS": "n", "UCX_MM_FIFO_SIZE": "4096",
               "UCX_TCP_TX_SEG_SIZE": "64K", "UCX_TCP_RX_SEG_SIZE": "256K"}
"""Blocking progress (driven by ucx_progress.UcxProgress): the default thread mode is 3-6x slower where
cores are few.

Shared memory between agents of one host: ucxx opens every endpoint with peer error handling, and UCX
refuses its shared-memory transports (posix, sysv) to such endpoints unless their own error handling
is on (UCX_MM_ERROR_HANDLING); without it two agents of one host talk TCP over the loopback device.
Measured on 2 shared cores, raw tagged messages 1-256 MiB, idle cores: tcp 1.1-1.4 GB/s, sm 12-20 GB/s.
UCX moves a large message through shared memory in 8 KiB fragments (its rendezvous "fragmented
copy-in copy-out": no zero-copy transport accepts peer error handling), and the sender may run only
a FIFO ahead of the receiver: with UCX's 256 entries (2 MiB), a 16-64 MiB message fell to 0.5 GB/s
whenever other processes kept the cores busy (sender and receiver then take turns, one scheduling
slice per 2 MiB); 4096 entries (32 MiB, 512 KiB of FIFO per worker) kept it at 4.5-7 GB/s.

TCP segments (across hosts, or where shared memory is off): UCX's 8 KiB send segments cost a system
call per 8 KiB; 64 KiB / 256 KiB doubled raw tagged messages of 1-256 MiB over the loopback device
(1.3-1.4 -> 2.5-3.8 GB/s)."""
LOOPBACK_ENV = {"UCX_TLS": "sm,tcp,self", "UCX_NET_DEVICES": "lo", "UCX_MM_ERROR_HANDLING": "y"}
"""Shared memory, and TCP over the loopback device only: UCX's own sockets then bind 127.0.0.1.
Shared memory only here, where the agents are processes of one Ray on one host: between hosts that
share a kernel but not a PID namespace (containers of one machine, the multihost tests' network
namespaces) UCX judged shared memory reachable and the pulls failed (outcome unauthenticated)."""


def ucx_env(loopback: bool = False) -> dict[str, str]:
    """UCX's environment: DEFAULT_ENV, and LOOPBACK_ENV too when UCX must stay on 127.0.0.1."""
    return {**DEFAULT_ENV, **(LOOPBACK_ENV if loopback else {})}
