#!/usr/bin/env python3
"""torch.distributed side of the comparison: the same collectives, sizes, dtype and timing
method as nccl-channel's `bench` example (CUDA events around -n launches, the slowest rank's
time, nccl-tests' bus bandwidth), one process per GPU.

    python3 -m torch.distributed.run --nproc_per_node 2 bench/torch_bench.py -c all -b 8 -e 4G -f 2 -n 20 -w 5 [-G] [-R 0,1,2]

-R picks where the tensors live, as the Rust bench spells it: 0 torch's caching allocator
(plain cudaMalloc memory), 1 a torch.cuda.MemPool over the process group's NCCL allocator
(ncclMemAlloc), registered with the communicator (register_mem_pool: ncclCommRegister),
2 the same pool registered as symmetric windows (register_mem_pool(pool, symm=True):
ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC). `pool` has no torch counterpart and
is skipped. Send and receive tensors are allocated (and registered) once per mode for the
largest size; smaller sizes use their leading slices. With several modes each size runs
once per mode and the table gets one row per mode, with busbw and time relative to mode 0.
A mode this torch cannot do prints why and is left out.
"""
import argparse
import os

import torch
import torch.distributed as dist

ALL = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv"]
DTYPES = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16,
          "double": torch.float64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8}


def size_arg(s):
    mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(s[:-1] if mul > 1 else s) * mul


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2 * (n - 1) / n
    if coll in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


MODES = {"0": "torch caching allocator", "1": "NCCL mem pool + register_mem_pool",
         "2": "NCCL mem pool + register_mem_pool(symm=True)", "pool": "-"}


def mode_list(values):
    out = []
    for v in values or ["0"]:
        for m in v.split(","):
            if m not in MODES:
                raise SystemExit(f"torch_bench: -R takes 0, 1, 2 or pool, not {m!r}")
            if m not in out:
                out.append(m)
    return out


class Memory:
    """One mode's send and receive tensors (largest size), and what registered them."""

    def __init__(self, mode, send, recv, backend=None, pool=None):
        self.mode, self.send, self.recv, self.backend, self.pool = mode, send, recv, backend, pool

    def release(self):
        if self.pool is not None:
            try:
                self.backend.deregister_mem_pool(self.pool)
            except Exception as e:  # noqa: BLE001 - report, do not fail the run at exit
                print(f"# mode {self.mode}: deregister_mem_pool failed: {e}", flush=True)
        self.send = self.recv = self.pool = None


def alloc(mode, send_max, recv_max, dt, dev, say):
    """The mode's tensors, or None after saying why this torch cannot do the mode."""
    if mode == "0":
        return Memory(mode, torch.ones(send_max, dtype=dt, device=dev), torch.zeros(recv_max, dtype=dt, device=dev))
    if mode == "pool":
        say("# mode pool skipped: torch has no pool owned by the communicator (mode 1 is torch's NCCL mem pool)")
        return None
    try:
        backend = dist.group.WORLD._get_backend(dev)
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            send = torch.ones(send_max, dtype=dt, device=dev)
            recv = torch.zeros(recv_max, dtype=dt, device=dev)
    except Exception as e:  # noqa: BLE001 - any missing piece of the API
        say(f"# torch mem pool unavailable: {type(e).__name__}: {e}; mode {mode} skipped")
        return None
    try:
        if mode == "2":
            backend.register_mem_pool(pool, symm=True)
        else:
            backend.register_mem_pool(pool)
    except TypeError as e:
        # A torch whose register_mem_pool has no symm keyword: no symmetric windows.
        say(f"# mode {mode} skipped: symmetric memory unavailable: register_mem_pool(pool, symm=True): {e}")
        return None
    except Exception as e:  # noqa: BLE001
        say(f"# torch mem pool unavailable: register_mem_pool: {type(e).__name__}: {e}; mode {mode} skipped")
        return None
    return Memory(mode, send, recv, backend, pool)


def counts(coll, size, tsize, n):
    """(send elements, recv elements, count column), as the Rust bench counts them."""
    total = max(size // tsize, 1)
    c = max(total // n, 1)
    if coll == "all_gather":
        return c, c * n, c * n
    if coll == "reduce_scatter":
        return c * n, c, c * n
    if coll == "all_to_all":
        return c * n, c * n, c * n
    return total, total, total


def ratio(num, den):
    return f"{num / den:.3f}" if den > 0 else "-"


def measure(coll, send, recv, a, rank, n, dev, stream):
    """µs per operation (CUDA events around -n launches, or one replay of their graph),
    the largest over the ranks."""

    def op():
        if coll == "all_reduce":
            dist.all_reduce(send)
        elif coll == "all_gather":
            dist.all_gather_into_tensor(recv, send)
        elif coll == "reduce_scatter":
            dist.reduce_scatter_tensor(recv, send)
        elif coll == "broadcast":
            dist.broadcast(send, 0)
        elif coll == "reduce":
            dist.reduce(send, 0)
        elif coll == "all_to_all":
            dist.all_to_all_single(recv, send)
        elif coll == "sendrecv":
            ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

    send.fill_(1)  # the memory is reused across sizes; start every size from the same values
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for _ in range(a.w):
            op()
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if a.G:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for _ in range(a.n):
                    op()
            g.replay()
            stream.synchronize()
            start.record(stream)
            g.replay()
            end.record(stream)
        else:
            start.record(stream)
            for _ in range(a.n):
                op()
            end.record(stream)
        end.synchronize()
        us = torch.tensor([start.elapsed_time(end) * 1000.0 / a.n], dtype=torch.float64, device=dev)
    dist.all_reduce(us, op=dist.ReduceOp.MAX)
    return us.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-c", default="all_reduce")
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-d", default="float")
    p.add_argument("-G", action="store_true")
    p.add_argument("-R", action="append", help="memory modes: 0, 1, 2 (comma list or repeated)")
    a = p.parse_args()
    modes = mode_list(a.R)
    colls = ALL if a.c == "all" else a.c.split(",")
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    dt = DTYPES[a.d]
    tsize = torch.tensor([], dtype=dt).element_size()
    stream = torch.cuda.Stream()

    def say(line):
        if rank == 0:
            print(line, flush=True)

    say(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} ranks")
    say("# memory modes (-R): " + ", ".join(f"{m} ({MODES[m]})" for m in modes))
    sizes = []
    size = size_arg(a.b)
    while size <= size_arg(a.e):
        sizes.append(size)
        size *= a.f
    largest = sizes[-1] if sizes else size_arg(a.b)
    send_max = max(counts(c, largest, tsize, n)[0] for c in colls)
    recv_max = max(counts(c, largest, tsize, n)[1] for c in colls)
    mems = [m for m in (alloc(mode, send_max, recv_max, dt, dev, say) for mode in modes) if m is not None]
    if not mems and "0" not in modes:
        say("# falling back to mode 0")
        modes.append("0")
        mems.append(alloc("0", send_max, recv_max, dt, dev, say))
    multi = len(modes) > 1
    base = next((i for i, m in enumerate(mems) if m.mode == "0"), 0)
    if not mems:
        say("# no memory mode left to run")
    else:
        say(f"# memory: send {send_max} and recv {recv_max} elements per mode, allocated (and registered) once "
            f"for the largest size, outside the timing; smaller sizes use leading slices"
            + (f"; ratios against mode {mems[base].mode}" if multi else ""))
    for coll in colls if mems else []:
        extra = f"   {'mem':>5}   {'busbw':>7} {'time':>7}" if multi else ""
        units = f"   {'(-R)':>5}   {'/base':>7} {'/base':>7}" if multi else ""
        say(f"#\n# {coll}: {n} ranks, type {a.d}, graphs {'yes' if a.G else 'no'}")
        say(f"#{'size':>12} {'count':>12} {'type':>9}   {'time':>9} {'algbw':>7} {'busbw':>7}{extra}")
        say(f"#{'(B)':>12} {'(elements)':>12} {'':>9}   {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}{units}")
        total_bus, rows = [0.0] * len(mems), 0
        for size in sizes:
            sn, rn, count = counts(coll, size, tsize, n)
            results = []
            for mem in mems:
                results.append(measure(coll, mem.send[:sn], mem.recv[:rn], a, rank, n, dev, stream))
            nbytes = count * tsize
            rows += 1
            lines = []
            for i, (mem, us) in enumerate(zip(mems, results)):
                algbw = nbytes / us / 1e3
                busbw = algbw * bus_factor(coll, n)
                total_bus[i] += busbw
                line = f" {nbytes:>12} {count:>12} {a.d:>9}   {us:>9.2f} {algbw:>7.2f} {busbw:>7.2f}"
                if multi:
                    line += f"   {mem.mode:>5}   {ratio(results[base], us):>7} {ratio(us, results[base]):>7}"
                lines.append(line)
            say("\n".join(lines))
        for mem, tb in zip(mems, total_bus):
            say(f"# Avg bus bandwidth    : {tb / max(rows, 1):.3f} ({coll}{', mem ' + mem.mode if multi else ''})")
    for mem in mems:
        mem.release()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
