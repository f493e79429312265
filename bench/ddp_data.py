"""The data of nccl-channel's data_parallel example (examples/data_parallel/data.rs),
ported to Python so that bench/ddp_bench.py trains torch DDP on the same shards, bit for
bit.

data.rs, restated:

- SplitMix64 from seed 0x5EED0000 + rank. Its k-th output (k = 0, 1, ...) is
  mix(seed + (k + 1) * 0x9E3779B97F4A7C15 mod 2**64), so any range of outputs can be
  computed at once (vectorised) without stepping through the ones before.
- uniform = (output >> 40) / 2**23 - 1 in f32: a 24-bit integer, an exact division by a
  power of two and an exact subtraction, so the value is exact however it is computed.
- The shard: outputs 0 .. n*d - 1 are x (row-major, n rows of d features); outputs
  n*d .. n*d + n - 1 are the rows' noise.
- The true weights: w[j] = ((j * 7919) % 13) / 6 - 1 in f32 (a rounded division, then an
  exact subtraction), j = 0 .. d; w[d] is the bias.
- y[i] = (dot + w[d]) + 0.01 * noise[i], each operation rounded to f32, where dot is the
  f32 sum of x[i][j] * w[j] (each product rounded to f32) added in order j = 0, 1, ...,
  starting from the first product (Rust's f32 `sum` starts from -0.0, which leaves it
  unchanged), never pairwise or fused.

Every f32 operation here is of f32 operands, so computing it in f64 and rounding to f32
gives the same value as an f32 operation (f64 has more than twice the bits plus two), which
is how the pure-Python version rounds. The numpy and torch versions compute in f32, with the
same order of additions (a loop over the features, vectorised over the rows), and check a
few rows against the pure-Python version before they return.

bench/test_ddp_data.py checks this against values printed by the Rust example
(`data_parallel --print-shard RANK --samples N --features D`).
"""
import struct

GAMMA = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
M1, M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def seed(rank):
    return 0x5EED0000 + rank


def f32(v):
    """`v` rounded to the nearest f32 (as a Python float)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def mix(z):
    z = ((z ^ (z >> 30)) * M1) & MASK
    z = ((z ^ (z >> 27)) * M2) & MASK
    return z ^ (z >> 31)


def output(rank, k):
    """The k-th output (from 0) of rank `rank`'s generator."""
    return mix((seed(rank) + (k + 1) * GAMMA) & MASK)


def uniform(rank, k):
    """The k-th uniform value in [-1, 1) of rank `rank`'s generator (exact in f32)."""
    return (output(rank, k) >> 40) / float(1 << 23) - 1.0


def true_weights(d):
    """The d weights and the bias the labels are made from, as f32 values."""
    return [f32(f32(((j * 7919) % 13) / 6.0) - 1.0) for j in range(d + 1)]


def row_py(rank, n, d, i, w=None):
    """Row i of rank `rank`'s shard of n rows of d features: (x[i] as a list, y[i]), in pure
    Python (f32 values as Python floats)."""
    w = true_weights(d) if w is None else w
    x = [uniform(rank, i * d + j) for j in range(d)]
    acc = f32(x[0] * w[0])
    for j in range(1, d):
        acc = f32(acc + f32(x[j] * w[j]))
    y = f32(f32(acc + w[d]) + f32(f32(0.01) * uniform(rank, n * d + i)))
    return x, y


def shard_py(rank, n, d):
    """The whole shard in pure Python: (x as n lists of d floats, y as n floats). For small
    sizes (tests)."""
    w = true_weights(d)
    rows = [row_py(rank, n, d, i, w) for i in range(n)]
    return [r[0] for r in rows], [r[1] for r in rows]


# Rows of x generated at once by the vectorised versions (bounds their temporaries).
CHUNK = 1 << 22


def shard_numpy(rank, n, d):
    """The shard with numpy: (x of shape (n, d), y of shape (n,)), float32."""
    import numpy as np

    def uniforms(k0, count):
        out = np.empty(count, dtype=np.float32)
        for a in range(0, count, CHUNK):
            b = min(count, a + CHUNK)
            k = np.arange(k0 + a + 1, k0 + b + 1, dtype=np.uint64)
            with np.errstate(over="ignore"):
                z = np.uint64(seed(rank)) + k * np.uint64(GAMMA)
                z = (z ^ (z >> np.uint64(30))) * np.uint64(M1)
                z = (z ^ (z >> np.uint64(27))) * np.uint64(M2)
            z = z ^ (z >> np.uint64(31))
            out[a:b] = (z >> np.uint64(40)).astype(np.float32) / np.float32(1 << 23) - np.float32(1)
        return out

    x = uniforms(0, n * d).reshape(n, d)
    noise = uniforms(n * d, n)
    w = np.array(true_weights(d), dtype=np.float32)
    cols = np.ascontiguousarray(x.T)  # a feature's values over the rows, contiguous
    acc = cols[0] * w[0]
    for j in range(1, d):
        acc = acc + cols[j] * w[j]
    del cols
    y = (acc + w[d]) + np.float32(0.01) * noise
    return x, y


def shard_torch(rank, n, d):
    """The shard with torch on the CPU (for where numpy is missing): (x of shape (n, d), y of
    shape (n,)), float32. 64-bit words are held in int64 (the same bits): products wrap as
    in two's complement, and the right shifts are made logical with a mask."""
    import torch

    def signed(v):
        return v - (1 << 64) if v >= 1 << 63 else v

    def shr(z, s):
        return (z >> s) & ((1 << (64 - s)) - 1)

    def uniforms(k0, count):
        out = torch.empty(count, dtype=torch.float32)
        for a in range(0, count, CHUNK):
            b = min(count, a + CHUNK)
            k = torch.arange(k0 + a + 1, k0 + b + 1, dtype=torch.int64)
            z = k * signed(GAMMA) + seed(rank)
            z = (z ^ shr(z, 30)) * signed(M1)
            z = (z ^ shr(z, 27)) * signed(M2)
            z = z ^ shr(z, 31)
            out[a:b] = shr(z, 40).to(torch.float32) / float(1 << 23) - 1.0
        return out

    x = uniforms(0, n * d).reshape(n, d)
    noise = uniforms(n * d, n)
    w = true_weights(d)
    cols = x.t().contiguous()  # a feature's values over the rows, contiguous
    acc = cols[0] * w[0]
    for j in range(1, d):
        acc = acc + cols[j] * w[j]
    del cols
    y = (acc + w[d]) + f32(0.01) * noise
    return x, y


def check_rows(rank, n, d, x_row, y_at):
    """Compares rows 0, 1 and n - 1 of a vectorised shard (`x_row(i)` a list of floats,
    `y_at(i)` a float) with the pure-Python version, bit for bit; raises on a difference."""
    w = true_weights(d)
    for i in sorted({0, min(1, n - 1), n - 1}):
        x, y = row_py(rank, n, d, i, w)
        got = x_row(i)
        for j in range(d):
            if f32_bits(got[j]) != f32_bits(x[j]):
                raise ValueError(f"rank {rank}: x[{i}][{j}] = {got[j]!r}, want {x[j]!r}")
        if f32_bits(y_at(i)) != f32_bits(y):
            raise ValueError(f"rank {rank}: y[{i}] = {y_at(i)!r}, want {y!r}")


def shard(rank, n, d, prefer=("numpy", "torch")):
    """The shard, vectorised with the first of `prefer` that imports, checked against the
    pure-Python rows: (x, y, which), x of shape (n, d) and y of (n,), float32."""
    for which in prefer:
        try:
            __import__(which)
        except ImportError:
            continue
        x, y = (shard_numpy if which == "numpy" else shard_torch)(rank, n, d)
        check_rows(rank, n, d, lambda i: [float(v) for v in x[i]], lambda i: float(y[i]))
        return x, y, which
    raise ImportError("the shard needs numpy or torch to be computed at this size")
