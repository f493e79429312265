#!/usr/bin/env python3
"""Checks bench/ddp_data.py (the Python port of the data_parallel example's data) against
what the Rust example prints (bench/ddp_data_expected.txt), bit for bit.

    python3 bench/test_ddp_data.py    # plain Python; the numpy and torch versions are
                                      # checked too where those import, skipped elsewhere
"""
import importlib.util
import os
import re
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ddp_data  # noqa: E402


def expected():
    """The blocks of ddp_data_expected.txt: [((rank, n, d), {"x[i][j]" or "y[i]": bits})]."""
    blocks = []
    with open(os.path.join(HERE, "ddp_data_expected.txt")) as f:
        for line in f:
            m = re.match(r"shard of rank (\d+): (\d+) samples of (\d+) features$", line.strip())
            if m:
                blocks.append((tuple(int(g) for g in m.groups()), {}))
                continue
            m = re.match(r"((?:x\[\d+\]\[\d+\])|(?:y\[\d+\])) = 0x([0-9a-f]{8}) ", line)
            if m:
                blocks[-1][1][m.group(1)] = int(m.group(2), 16)
    return blocks


def index(key):
    """"x[i][j]" -> ("x", i, j); "y[i]" -> ("y", i, None)."""
    nums = [int(v) for v in re.findall(r"\d+", key)]
    return (key[0], nums[0], nums[1] if len(nums) > 1 else None)


def has(module):
    return importlib.util.find_spec(module) is not None


class Expected(unittest.TestCase):
    def test_the_file_has_the_blocks(self):
        blocks = expected()
        self.assertEqual(len(blocks), 4)
        # Rows 0, 1, n-1 and features 0, 1, d-2, d-1 (fewer where they coincide): 16 x
        # values and 4 labels for 4 rows of 300 features.
        self.assertEqual(blocks[0][0], (1, 4, 300))
        self.assertEqual(len(blocks[0][1]), 20)

    def check(self, x_at, y_at, want):
        for key, bits in want.items():
            kind, i, j = index(key)
            got = x_at(i, j) if kind == "x" else y_at(i)
            self.assertEqual(ddp_data.f32_bits(got), bits,
                             f"{key}: {got!r} ({ddp_data.f32_bits(got):#010x}), want {bits:#010x}")

    def test_pure_python(self):
        for (rank, n, d), want in expected():
            rows = {}

            def row(i):
                if i not in rows:
                    rows[i] = ddp_data.row_py(rank, n, d, i)
                return rows[i]

            self.check(lambda i, j: row(i)[0][j], lambda i: row(i)[1], want)

    @unittest.skipUnless(has("numpy"), "numpy is not installed")
    def test_numpy(self):
        for (rank, n, d), want in expected():
            x, y = ddp_data.shard_numpy(rank, n, d)
            self.check(lambda i, j: float(x[i, j]), lambda i: float(y[i]), want)

    @unittest.skipUnless(has("torch"), "torch is not installed")
    def test_torch(self):
        for (rank, n, d), want in expected():
            x, y = ddp_data.shard_torch(rank, n, d)
            self.check(lambda i, j: float(x[i, j]), lambda i: float(y[i]), want)


class Generator(unittest.TestCase):
    def test_closed_form_equals_stepping(self):
        # SplitMix64 stepped as data.rs does, against the k-th output computed directly.
        state = ddp_data.seed(3)
        for k in range(50):
            state = (state + ddp_data.GAMMA) & ddp_data.MASK
            self.assertEqual(ddp_data.mix(state), ddp_data.output(3, k))

    def test_a_wrong_value_is_caught(self):
        # The comparison can fail: one flipped bit in y is reported.
        (rank, n, d), want = expected()[1]
        key = next(k for k in want if k.startswith("y["))
        wrong = dict(want)
        wrong[key] ^= 1
        x, y = ddp_data.shard_py(rank, n, d)
        with self.assertRaises(AssertionError):
            Expected.check(self, lambda i, j: x[i][j], lambda i: y[i], wrong)

    def test_f32_rounding(self):
        self.assertEqual(ddp_data.f32_bits(ddp_data.f32(0.01)), 0x3C23D70A)
        self.assertEqual(struct.pack("<f", ddp_data.f32(1 / 3)), struct.pack("<f", 1 / 3))

    def test_true_weights(self):
        # ((j * 7919) % 13) / 6 - 1 for j = 0, 1, 2: 0 -> -1, 2 -> -2/3, 4 -> -1/3.
        w = ddp_data.true_weights(2)
        self.assertEqual(w[0], -1.0)
        self.assertEqual(ddp_data.f32_bits(w[1]), ddp_data.f32_bits(ddp_data.f32(ddp_data.f32(2 / 6) - 1)))
        self.assertEqual(len(w), 3)


if __name__ == "__main__":
    unittest.main()
