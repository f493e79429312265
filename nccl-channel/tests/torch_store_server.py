"""A real torch TCPStore server for tests/torch_store_real.rs.

Usage: python3 torch_store_server.py <1: libuv backend | 0: legacy backend>

Prints the port on stdout, then the torch version and backend on stderr. Then, for every
line of keys read on stdin, answers one line: the number of keys the store holds, then
`present` or `absent` for each key, as a torch client sees them. An empty line or the end
of stdin stops it.
"""

import datetime
import sys

import torch
import torch.distributed as dist

use_libuv = sys.argv[1] == "1"
timeout = datetime.timedelta(seconds=60)
server = dist.TCPStore(
    "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout, use_libuv=use_libuv
)
print(server.port, flush=True)
print(
    f"torch {torch.__version__}, TCPStore libuv backend: {server.libuvBackend}",
    file=sys.stderr,
    flush=True,
)
client = dist.TCPStore(
    "127.0.0.1", server.port, is_master=False, timeout=timeout, use_libuv=use_libuv
)
for line in sys.stdin:
    keys = line.split()
    if not keys:
        break
    seen = ["present" if client.check([k]) else "absent" for k in keys]
    print(client.num_keys(), *seen, flush=True)
