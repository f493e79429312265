#!/usr/bin/env python3
"""torch DDP side of the data-parallel comparison: the training step of nccl-channel's
data_parallel example (examples/data_parallel), the same model, data, loss, optimizer and
timing, under torch.nn.parallel.DistributedDataParallel, one process per GPU.

    NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc_per_node 2 bench/ddp_bench.py \\
        [--features 1024] [--samples 8192] [--steps 100] [--lr 0.5] [--bucket 256] \\
        [--log-every 10] [--layout linear|buckets] [--cpu]

Without torch.distributed.run it is one rank (world size 1). --cpu trains on the CPU over
gloo instead of NCCL (a smoke test).

What is the same as the Rust example:

- Model: linear regression, d weights and a bias (d + 1 parameters), zero at the start.
- Data: rank r's shard is data.rs's, bit for bit (bench/ddp_data.py: a port checked against
  the example's own output by bench/test_ddp_data.py, and against its pure-Python rows
  here before training).
- Loss and gradient: the mean squared error of the rank's n samples (torch's mse_loss),
  whose gradient is 2/n * sum_i r_i x_i as the example's kernel computes; DDP averages it
  over the ranks as the example's ReduceOp::Avg does.
- Optimizer: plain SGD (no momentum), --lr 0.5 by default.
- Timing: a CUDA event recorded on the compute stream at every step's start; a step is from
  one start to the next; the first two steps and the steps that log the loss (they wait for
  the host) are left out. Rank 0 prints "step time X us". The loss lines and the final loss
  are printed as the example prints them (Rust's {:e} format).

Buckets. --bucket is in floats, as the example's. DDP never splits a parameter over
buckets, so how far its buckets can match the example's depends on the model's parameters:

- --layout linear (default): one torch.nn.Linear(features, 1). bucket_cap_mb is
  --bucket * 4 / 2**20, the first bucket's cap too, but the weight is one tensor of d
  floats: DDP all-reduces it in one bucket (with the bias or beside it), whatever --bucket.
- --layout buckets: the same model with its d + 1 parameters split as the example splits
  its flat gradient (chunks of --bucket floats of [w_0 .. w_{d-1}, bias], the bias the last
  chunk's last element), one torch Parameter per chunk, each used by its own matrix-vector
  product. The caps are set to the smallest chunk's bytes, so that DDP closes every bucket
  after one parameter (it closes a bucket once its size reaches the cap): its buckets are
  then the example's, one for one (in the reverse order, the order backward makes them).
  Its forward and backward are one kernel per chunk, as the example's --overlap gradient.

DDP builds its buckets in the first step (one bucket over everything) and rebuilds them in
the order the gradients became ready at the second; the timed steps come after. The
buckets it used are printed from its logging data (rebuilt_bucket_sizes). DDP's first
bucket may have a cap of its own: this sets it equal to the others, by the constructor's
argument where this torch has one (first_bucket_cap_mb) and by
torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, which the torch versions without it read.
"""
import argparse
import inspect
import math
import os
import sys
import time

# Never NVLink SHARP/multicast here (cuMulticastCreate): set before NCCL starts.
os.environ["NCCL_NVLS_ENABLE"] = "0"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_data  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def rust_e(v, prec):
    """`v` as Rust's {:.PRECe} prints it: no '+' and no padding in the exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    mant, exp = f"{v:.{prec}e}".split("e")
    return f"{mant}e{int(exp)}"


def positive(kind):
    def parse(s):
        v = kind(s)
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{s!r} is not positive")
        return v
    return parse


def options():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features", type=positive(int), default=1024, help="features per sample")
    p.add_argument("--samples", type=positive(int), default=8192, help="samples per rank")
    p.add_argument("--steps", type=positive(int), default=100, help="gradient-descent steps")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate")
    p.add_argument("--bucket", type=positive(int), default=256, help="floats per all-reduce bucket")
    p.add_argument("--log-every", type=positive(int), default=10, help="print the loss every this many steps")
    p.add_argument("--layout", choices=["linear", "buckets"], default="linear",
                   help="linear: one nn.Linear; buckets: one parameter per bucket of the example")
    p.add_argument("--cpu", action="store_true", help="train on the CPU over gloo (a smoke test)")
    return p.parse_args()


def chunk_ranges(d, bucket):
    """The example's buckets of the flat [w_0 .. w_{d-1}, bias]: (start, end) pairs."""
    return [(a, min(a + bucket, d + 1)) for a in range(0, d + 1, bucket)]


class Linear(torch.nn.Module):
    """torch.nn.Linear(d, 1) zeroed, as (n,) predictions."""

    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, 1)
        with torch.no_grad():
            self.lin.weight.zero_()
            self.lin.bias.zero_()

    def forward(self, x):
        return self.lin(x).squeeze(1)

    def flat(self):
        return torch.cat([self.lin.weight.reshape(-1), self.lin.bias.reshape(-1)])


class Buckets(torch.nn.Module):
    """The same model with one parameter per bucket of the example's flat gradient."""

    def __init__(self, d, bucket):
        super().__init__()
        self.d = d
        self.ranges = chunk_ranges(d, bucket)
        self.chunks = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(e - a)) for a, e in self.ranges])

    def forward(self, x):
        out = None
        for (a, e), p in zip(self.ranges, self.chunks):
            cols = min(e, self.d) - a  # the chunk's weights (the bias is not a column)
            if cols > 0:
                t = torch.mv(x[:, a:a + cols], p[:cols])
                out = t if out is None else out + t
        return out + self.chunks[-1][-1]

    def flat(self):
        return torch.cat([p.reshape(-1) for p in self.chunks])


def ddp_buckets(ddp):
    """The sizes (bytes) of the buckets DDP rebuilt after its first step, in the order they
    are reduced, from its logging data (which has them from the third step on); None if
    unknown."""
    try:
        data = ddp._get_ddp_logging_data()
        sizes = data.get("rebuilt_bucket_sizes") if data.get("has_rebuilt_buckets") else None
        if sizes:
            return [int(s) for s in str(sizes).split(",")]
    except Exception:  # noqa: BLE001 - private API: report unknown instead
        pass
    return None


def main():
    o = options()
    if "RANK" not in os.environ:  # one rank without torch.distributed.run
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    n, d = o.samples, o.features
    if o.cpu:
        dev, backend = torch.device("cpu"), "gloo"
    else:
        torch.cuda.set_device(local)
        dev, backend = torch.device("cuda", local), "nccl"
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 as the example's kernels
    dist.init_process_group(backend, rank=rank, world_size=world)

    def say(*a):
        if rank == 0:
            print(*a, flush=True)

    t0 = time.perf_counter()
    x, y, how = ddp_data.shard(rank, n, d)
    if how == "numpy":
        x, y = torch.from_numpy(x), torch.from_numpy(y)
    x, y = x.to(dev), y.to(dev)
    say(f"rank 0 of {world}: data made with {how} in {time.perf_counter() - t0:.1f} s, "
        f"checked against the pure-Python port of data.rs; torch {torch.__version__}, {backend}")

    model = (Linear(d) if o.layout == "linear" else Buckets(d, o.bucket)).to(dev)
    if o.layout == "linear":
        cap = o.bucket * 4
    else:
        cap = min(e - a for a, e in chunk_ranges(d, o.bucket)) * 4
    kwargs = dict(bucket_cap_mb=cap / 2**20, gradient_as_bucket_view=True)
    if not o.cpu:
        kwargs["device_ids"] = [local]
    if "first_bucket_cap_mb" in inspect.signature(DDP.__init__).parameters:
        kwargs["first_bucket_cap_mb"] = cap / 2**20
    if hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES"):
        dist._DEFAULT_FIRST_BUCKET_BYTES = cap
    ddp = DDP(model, **kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=o.lr)

    def mean_over_ranks(v):
        v = v.detach().clone().reshape(1)
        dist.all_reduce(v, op=dist.ReduceOp.SUM)  # gloo has no AVG
        return v.item() / world

    def mark():
        if o.cpu:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    marks, logged = [], []
    for step in range(o.steps):
        marks.append(mark())
        opt.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if step % o.log_every == 0:
            # The loss of this step's forward: of the weights before the update.
            l = mean_over_ranks(loss)
            logged.append(l)
            say(f"step {step:>5}  loss {rust_e(l, 6)}")
    with torch.no_grad():
        final = mean_over_ranks(F.mse_loss(model(x), y))
    say(f"final  {o.steps:>5}  loss {rust_e(final, 6)}")

    if not o.cpu:
        torch.cuda.synchronize()
    step_ms, timed = 0.0, 0
    for k in range(2, len(marks) - 1):
        if k % o.log_every == 0:
            continue
        if o.cpu:
            step_ms += (marks[k + 1] - marks[k]) * 1e3
        else:
            step_ms += marks[k].elapsed_time(marks[k + 1])
        timed += 1

    with torch.no_grad():
        mine = model.flat()
        hi, lo = mine.clone(), mine.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        same = bool(torch.equal(hi, mine) and torch.equal(lo, mine))
    first = logged[0] if logged else float("nan")
    say(f"weights {'equal' if same else 'DIFFER'} on all {world} ranks; loss {rust_e(first, 4)} -> "
        f"{rust_e(final, 4)} in {o.steps} steps")
    sizes = ddp_buckets(ddp)
    ours = len(chunk_ranges(d, o.bucket))
    if sizes is None:
        got = "its buckets unknown (no rebuilt_bucket_sizes in its logging data: fewer than 3 steps?)"
    else:
        got = f"{len(sizes)} buckets of {', '.join(str(s // 4) for s in sizes)} floats"
    if timed > 0:
        say(f"step time {step_ms / timed * 1e3:.1f} us, torch DDP (layout {o.layout}, bucket caps "
            f"{cap} bytes): {got} ({d + 1} floats of gradient; the example: {ours} buckets of <= "
            f"{o.bucket} floats), over {timed} steps{' (CPU, gloo)' if o.cpu else ''}")
    dist.destroy_process_group()
    if not same:
        sys.exit("ddp_bench: the weights differ between ranks")


if __name__ == "__main__":
    main()
