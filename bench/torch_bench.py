#!/usr/bin/env python3
"""torch.distributed side of the comparison: the same collectives, sizes, dtype and timing
method as nccl-channel's `bench` example (CUDA events around -n launches, the slowest rank's
time, nccl-tests' bus bandwidth), one process per GPU.

    python3 -m torch.distributed.run --nproc_per_node 2 bench/torch_bench.py -c all -b 8 -e 4G -f 2 -n 20 -w 5 [-G]
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
    a = p.parse_args()
    colls = ALL if a.c == "all" else a.c.split(",")
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    dt = DTYPES[a.d]
    tsize = torch.tensor([], dtype=dt).element_size()
    stream = torch.cuda.Stream()
    if rank == 0:
        print(f"# torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, {n} ranks")
    for coll in colls:
        if rank == 0:
            print(f"#\n# {coll}: {n} ranks, type {a.d}, graphs {'yes' if a.G else 'no'}")
            print(f"#{'size':>12} {'count':>12} {'type':>9}   {'time':>9} {'algbw':>7} {'busbw':>7}")
            print(f"#{'(B)':>12} {'(elements)':>12} {'':>9}   {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7}")
        total_bus, rows = 0.0, 0
        size = size_arg(a.b)
        while size <= size_arg(a.e):
            total = max(size // tsize, 1)
            c = max(total // n, 1)
            if coll == "all_gather":
                send, recv, count = torch.ones(c, dtype=dt, device=dev), torch.empty(c * n, dtype=dt, device=dev), c * n
            elif coll == "reduce_scatter":
                send, recv, count = torch.ones(c * n, dtype=dt, device=dev), torch.empty(c, dtype=dt, device=dev), c * n
            elif coll == "all_to_all":
                send, recv, count = torch.ones(c * n, dtype=dt, device=dev), torch.empty(c * n, dtype=dt, device=dev), c * n
            else:
                send, recv, count = torch.ones(total, dtype=dt, device=dev), torch.empty(total, dtype=dt, device=dev), total

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
            us = us.item()
            nbytes = count * tsize
            algbw = nbytes / us / 1e3
            busbw = algbw * bus_factor(coll, n)
            total_bus += busbw
            rows += 1
            if rank == 0:
                print(f" {nbytes:>12} {count:>12} {a.d:>9}   {us:>9.2f} {algbw:>7.2f} {busbw:>7.2f}", flush=True)
            del send, recv
            size *= a.f
        if rank == 0:
            print(f"# Avg bus bandwidth    : {total_bus / max(rows, 1):.3f} ({coll})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
