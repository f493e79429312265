//! The NCCL mock's reduction arithmetic against independent references, through real
//! collectives: pseudo-random inputs that the types do not hold exactly (floats) or that
//! span the whole range (integers), every op, 2 to 4 ranks.
//!
//! The references mirror the mock's documented order, which is NCCL's: each rank's term
//! (its input, or for a pre-multiplied sum and a float average its input times its
//! scalar, rounded to the type; the average's scalar is 1/n rounded to the type) is
//! combined in rank order, rounding (or wrapping) to the type after every step; an
//! integer average divides the wrapped sum by n, truncating toward zero. f16/bf16 round
//! through the `half` crate, fp8 through a table written from the OCP spec, which
//! saturates as NCCL's `__NV_SATFINITE` conversions do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use test_support::{ocp_fp8, splitmix};

use std::ffi::c_void;

use crate::common::{NCCL_OK, OK, Rig};
use cuda_sys::CUdeviceptr;
use nccl_sys::{ncclDataType_t as D, ncclRedOp_t as Op, ncclScalarResidence_t};
use ocp_fp8::{E4M3, E5M2};
use splitmix::SplitMix;

/// Output elements per rank.
const COUNT: usize = 192;

/// The ops a case runs; `PreMul` is a `ncclRedOpCreatePreMulSum` op, with each rank's
/// own scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Red {
    Builtin(Op),
    PreMul,
}

const REDS: [Red; 6] = [
    Red::Builtin(Op::ncclSum),
    Red::Builtin(Op::ncclProd),
    Red::Builtin(Op::ncclAvg),
    Red::Builtin(Op::ncclMin),
    Red::Builtin(Op::ncclMax),
    Red::PreMul,
];

/// The collective that carries the reduction.
#[derive(Clone, Copy, Debug)]
enum Coll {
    AllReduce,
    /// To the last rank.
    Reduce,
    ReduceScatter,
}

/// Runs `coll` over `inputs.len()` ranks (devices 0..n) with `red` on elements of `t`
/// (`esize` bytes); `scalars` are the ranks' pre-multiplied sum scalars. Returns each
/// rank's receive buffer (`None` where the collective writes none).
fn run(
    rig: &Rig,
    coll: Coll,
    t: D,
    esize: usize,
    red: Red,
    inputs: &[Vec<u8>],
    scalars: &[Vec<u8>],
) -> Vec<Option<Vec<u8>>> {
    let n = inputs.len();
    let comms = rig.comms(n);
    let (f, d) = (rig.nccl.fns(), rig.driver.fns());
    let recv_len = COUNT * esize;
    let mut bufs: Vec<(cuda_sys::CUstream, CUdeviceptr, CUdeviceptr, Op)> = Vec::new();
    for (r, input) in inputs.iter().enumerate() {
        rig.on(r);
        let (mut s, mut send, mut recv) = (std::ptr::null_mut(), 0, 0);
        let mut op = match red {
            Red::Builtin(op) => op,
            Red::PreMul => Op::ncclSum,
        };
        // SAFETY: valid out-pointers; `input` and the scalar hold what their sizes say.
        unsafe {
            assert_eq!((d.cuStreamCreate)(&mut s, 0), OK);
            assert_eq!((d.cuMemAlloc)(&mut send, input.len()), OK);
            assert_eq!((d.cuMemAlloc)(&mut recv, recv_len), OK);
            let rc = (d.cuMemcpyHtoD)(send, input.as_ptr().cast(), input.len());
            assert_eq!(rc, OK);
            assert_eq!((d.cuMemsetD8)(recv, 0, recv_len), OK);
            if red == Red::PreMul {
                let mut scalar = scalars[r].clone();
                let rc = (f.ncclRedOpCreatePreMulSum)(
                    &mut op,
                    scalar.as_mut_ptr().cast(),
                    t,
                    ncclScalarResidence_t::ncclScalarHostImmediate,
                    comms[r],
                );
                assert_eq!(rc, NCCL_OK);
            }
        }
        bufs.push((s, send, recv, op));
    }
    // SAFETY: device buffers of the sizes each call reads and writes, on the
    // communicators' devices; one thread drives every rank, so a group.
    unsafe {
        assert_eq!((f.ncclGroupStart)(), NCCL_OK);
        for (r, &(s, send, recv, op)) in bufs.iter().enumerate() {
            let (send, recv) = (send as *const c_void, recv as *mut c_void);
            let rc = match coll {
                Coll::AllReduce => (f.ncclAllReduce)(send, recv, COUNT, t, op, comms[r], s),
                Coll::Reduce => (f.ncclReduce)(send, recv, COUNT, t, op, n as i32 - 1, comms[r], s),
                Coll::ReduceScatter => (f.ncclReduceScatter)(send, recv, COUNT, t, op, comms[r], s),
            };
            assert_eq!(rc, NCCL_OK);
        }
        assert_eq!((f.ncclGroupEnd)(), NCCL_OK);
    }
    let mut out = Vec::new();
    for (r, &(s, send, recv, op)) in bufs.iter().enumerate() {
        rig.on(r);
        let mut v = vec![0u8; recv_len];
        // SAFETY: `v` holds recv_len bytes; live buffers, stream, op and communicator.
        unsafe {
            assert_eq!((d.cuStreamSynchronize)(s), OK);
            assert_eq!((d.cuMemcpyDtoH)(v.as_mut_ptr().cast(), recv, recv_len), OK);
            assert_eq!((d.cuMemFree)(send), OK);
            assert_eq!((d.cuMemFree)(recv), OK);
            assert_eq!((d.cuStreamDestroy)(s), OK);
            if red == Red::PreMul {
                assert_eq!((f.ncclRedOpDestroy)(op, comms[r]), NCCL_OK);
            }
        }
        let written = !matches!(coll, Coll::Reduce) || r == n - 1;
        out.push(written.then_some(v));
    }
    for c in comms {
        rig.destroy(c);
    }
    assert!(
        rig.world.violations().is_empty(),
        "{:?}",
        rig.world.violations()
    );
    out
}

/// A reference: one element's result from the ranks' decoded inputs and scalars.
type Reference<'a, T> = &'a dyn Fn(Red, &[T], &[T]) -> T;

/// Checks `coll` with `red` against `reference` (per element: the ranks' decoded
/// inputs and scalars in rank order, and n) on `inputs` drawn by `draw`.
#[allow(clippy::too_many_arguments)] // one case's description, one for one
fn check<T: Copy + std::fmt::Debug>(
    rig: &Rig,
    coll: Coll,
    t: D,
    esize: usize,
    red: Red,
    n: usize,
    rng: &mut SplitMix,
    draw: &dyn Fn(&mut SplitMix) -> Vec<u8>,
    decode: &dyn Fn(&[u8]) -> T,
    reference: Reference<'_, T>,
    same: &dyn Fn(T, T) -> bool,
) {
    let chunks = if matches!(coll, Coll::ReduceScatter) {
        n
    } else {
        1
    };
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|_| (0..COUNT * chunks).flat_map(|_| draw(rng)).collect())
        .collect();
    let scalars: Vec<Vec<u8>> = (0..n).map(|_| draw(rng)).collect();
    let s: Vec<T> = scalars.iter().map(|b| decode(b)).collect();
    let out = run(rig, coll, t, esize, red, &inputs, &scalars);
    for (r, got) in out.iter().enumerate() {
        let Some(got) = got else { continue };
        let chunk = if matches!(coll, Coll::ReduceScatter) {
            r
        } else {
            0
        };
        for i in 0..COUNT {
            let at = (chunk * COUNT + i) * esize;
            let x: Vec<T> = inputs.iter().map(|b| decode(&b[at..at + esize])).collect();
            let want = reference(red, &x, &s);
            let have = decode(&got[i * esize..(i + 1) * esize]);
            assert!(
                same(have, want),
                "{coll:?} {t:?} {red:?} over {n} ranks, rank {r} element {i}: inputs {x:?}, \
                 scalars {s:?}: got {have:?}, reference {want:?}"
            );
        }
    }
}

/// A float type under test: its size, how to decode a code, round a value to the type,
/// and draw a pseudo-random finite code.
struct FloatType {
    t: D,
    esize: usize,
    decode: fn(&[u8]) -> f64,
    round: fn(f64) -> f64,
    draw: fn(&mut SplitMix) -> Vec<u8>,
}

/// Sign, exponent field in `exps`, random mantissa of `man` bits, as a `bits`-wide code.
fn code(rng: &mut SplitMix, bits: u32, man: u32, exps: std::ops::RangeInclusive<u64>) -> u64 {
    let e = exps.start() + rng.below(exps.end() - exps.start() + 1);
    let sign = rng.next() & 1;
    (sign << (bits - 1)) | (e << man) | rng.below(1 << man)
}

impl FloatType {
    /// NCCL's float average is a pre-multiplied sum by `float(1.0/n)` converted to the
    /// type (`1.0/n` for a double).
    fn avg_scalar(&self, n: usize) -> f64 {
        if self.t == D::ncclFloat64 {
            1.0 / n as f64
        } else {
            (self.round)(f64::from((1.0 / n as f64) as f32))
        }
    }
}

fn float_types() -> [FloatType; 6] {
    [
        FloatType {
            t: D::ncclFloat16,
            esize: 2,
            decode: |b| half::f16::from_ne_bytes([b[0], b[1]]).to_f64(),
            round: |x| half::f16::from_f64(x).to_f64(),
            // Subnormals to 2^10: sums stay finite, products may overflow.
            draw: |r| (code(r, 16, 10, 0..=25) as u16).to_ne_bytes().to_vec(),
        },
        FloatType {
            t: D::ncclBfloat16,
            esize: 2,
            decode: |b| half::bf16::from_ne_bytes([b[0], b[1]]).to_f64(),
            round: |x| half::bf16::from_f64(x).to_f64(),
            draw: |r| (code(r, 16, 7, 107..=147) as u16).to_ne_bytes().to_vec(),
        },
        FloatType {
            t: D::ncclFloat8e4m3,
            esize: 1,
            decode: |b| E4M3.value(b[0]),
            round: |x| E4M3.round(x),
            // Every code but NaN: sums and products saturate often.
            draw: |r| {
                let c = code(r, 8, 3, 0..=15) as u8;
                vec![if c & 0x7f == 0x7f { c & 0xfe } else { c }]
            },
        },
        FloatType {
            t: D::ncclFloat8e5m2,
            esize: 1,
            decode: |b| E5M2.value(b[0]),
            round: |x| E5M2.round(x),
            // Every finite code.
            draw: |r| vec![code(r, 8, 2, 0..=30) as u8],
        },
        FloatType {
            t: D::ncclFloat32,
            esize: 4,
            decode: |b| f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
            round: |x| f64::from(x as f32),
            draw: |r| (code(r, 32, 23, 97..=157) as u32).to_ne_bytes().to_vec(),
        },
        FloatType {
            t: D::ncclFloat64,
            esize: 8,
            decode: |b| f64::from_ne_bytes(b.try_into().unwrap()),
            round: |x| x,
            draw: |r| code(r, 64, 52, 963..=1083).to_ne_bytes().to_vec(),
        },
    ]
}

/// The float reference: each rank's term, then a left fold in rank order, rounding
/// after every step.
fn float_reference(ft: &FloatType, red: Red, x: &[f64], s: &[f64]) -> f64 {
    let round = ft.round;
    let avg = ft.avg_scalar(x.len());
    let n = x.len();
    let term = |r: usize| match red {
        Red::PreMul => round(x[r] * s[r]),
        Red::Builtin(Op::ncclAvg) => round(x[r] * avg),
        Red::Builtin(_) => x[r],
    };
    let mut acc = term(0);
    for r in 1..n {
        let y = term(r);
        acc = round(match red {
            Red::Builtin(Op::ncclProd) => acc * y,
            Red::Builtin(Op::ncclMin) => acc.min(y),
            Red::Builtin(Op::ncclMax) => acc.max(y),
            _ => acc + y,
        });
    }
    acc
}

/// Same value, NaN matching NaN (zeros of either sign match).
fn same_float(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b
}

/// Every float type, every op, 2 to 4 ranks, through ncclAllReduce.
#[test]
fn float_reductions_round_as_the_references_do() {
    let rig = Rig::new(4);
    let mut rng = SplitMix(0xa117_ed0c);
    for ft in float_types() {
        for n in 2..=4 {
            for red in REDS {
                check(
                    &rig,
                    Coll::AllReduce,
                    ft.t,
                    ft.esize,
                    red,
                    n,
                    &mut rng,
                    &ft.draw,
                    &ft.decode,
                    &|red, x, s| float_reference(&ft, red, x, s),
                    &same_float,
                );
            }
        }
    }
}

/// ncclReduce and ncclReduceScatter compute with the same arithmetic (3 ranks, the ops
/// that round: sum, avg, pre-multiplied sum).
#[test]
fn reduce_and_reduce_scatter_round_the_same_way() {
    let rig = Rig::new(3);
    let mut rng = SplitMix(0x05ca_77e2);
    for ft in float_types() {
        for coll in [Coll::Reduce, Coll::ReduceScatter] {
            for red in [
                Red::Builtin(Op::ncclSum),
                Red::Builtin(Op::ncclAvg),
                Red::PreMul,
            ] {
                check(
                    &rig,
                    coll,
                    ft.t,
                    ft.esize,
                    red,
                    3,
                    &mut rng,
                    &ft.draw,
                    &ft.decode,
                    &|red, x, s| float_reference(&ft, red, x, s),
                    &same_float,
                );
            }
        }
    }
}

/// Every integer type, every op, 2 to 4 ranks, over the whole range: values drawn
/// uniformly from all bit patterns (so half of an unsigned type's are above the signed
/// range) or, one time in four, from the edges (MIN, MAX, 0, ±1, the signed boundary).
macro_rules! integer_test {
    ($name:ident, $ty:ty, $dt:expr) => {
        #[test]
        fn $name() {
            type T = $ty;
            const W: usize = std::mem::size_of::<T>();
            let mid = (T::MAX >> 1) as T;
            let edges: [T; 10] = [
                T::MIN,
                T::MAX,
                0,
                1,
                (0 as T).wrapping_sub(1),
                T::MIN.wrapping_add(1),
                T::MAX - 1,
                mid,
                mid.wrapping_add(1),
                mid.wrapping_add(2),
            ];
            let draw = move |r: &mut SplitMix| -> Vec<u8> {
                let v: T = if r.below(4) == 0 {
                    edges[r.below(edges.len() as u64) as usize]
                } else {
                    r.next() as T
                };
                v.to_ne_bytes().to_vec()
            };
            let decode = |b: &[u8]| T::from_ne_bytes(b[..W].try_into().unwrap());
            let reference = |red: Red, x: &[T], s: &[T]| -> T {
                let term = |r: usize| match red {
                    Red::PreMul => x[r].wrapping_mul(s[r]),
                    _ => x[r],
                };
                let mut acc = term(0);
                for r in 1..x.len() {
                    let y = term(r);
                    acc = match red {
                        Red::Builtin(Op::ncclProd) => acc.wrapping_mul(y),
                        Red::Builtin(Op::ncclMin) => acc.min(y),
                        Red::Builtin(Op::ncclMax) => acc.max(y),
                        _ => acc.wrapping_add(y),
                    };
                }
                if red == Red::Builtin(Op::ncclAvg) {
                    // NCCL's SumPostDiv: the wrapped sum over n, truncating toward zero.
                    acc /= x.len() as T;
                }
                acc
            };
            let rig = Rig::new(4);
            let mut rng = SplitMix(0x1d7 ^ W as u64);
            for n in 2..=4 {
                for red in REDS {
                    check(
                        &rig,
                        Coll::AllReduce,
                        $dt,
                        W,
                        red,
                        n,
                        &mut rng,
                        &draw,
                        &decode,
                        &reference,
                        &|a, b| a == b,
                    );
                }
            }
        }
    };
}

integer_test!(int8_wraps_and_compares_as_signed, i8, D::ncclInt8);
integer_test!(uint8_wraps_and_compares_as_unsigned, u8, D::ncclUint8);
integer_test!(int32_wraps_and_compares_as_signed, i32, D::ncclInt32);
integer_test!(uint32_wraps_and_compares_as_unsigned, u32, D::ncclUint32);
integer_test!(int64_wraps_and_compares_as_signed, i64, D::ncclInt64);
integer_test!(uint64_wraps_and_compares_as_unsigned, u64, D::ncclUint64);

/// The fp8 types came with NCCL 2.24: an older simulated NCCL refuses them, as the real
/// one does (an unknown `ncclDataType_t`), and takes every older type.
#[test]
fn fp8_needs_nccl_2_24() {
    use nccl_sys::{NcclVersion, ncclResult_t};
    for (version, fp8_ok) in [((2, 23, 4), false), ((2, 24, 0), true), ((2, 24, 3), true)] {
        let v = NcclVersion::new(version.0, version.1, version.2);
        let rig = Rig::with_nccl(1, |m| m.version(v));
        let comm = rig.comms(1)[0];
        rig.on(0);
        let f = rig.driver.fns();
        let (mut s, mut buf): (cuda_sys::CUstream, CUdeviceptr) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!((f.cuStreamCreate)(&mut s, 0), OK);
            assert_eq!((f.cuMemAlloc)(&mut buf, 64), OK);
        }
        for t in [
            D::ncclFloat8e4m3,
            D::ncclFloat8e5m2,
            D::ncclFloat32,
            D::ncclUint8,
        ] {
            let is_fp8 = matches!(t, D::ncclFloat8e4m3 | D::ncclFloat8e5m2);
            // SAFETY: 64 bytes of device memory hold 8 elements of any of these types.
            let rc = unsafe {
                (rig.nccl.fns().ncclAllReduce)(
                    buf as *const c_void,
                    buf as *mut c_void,
                    8,
                    t,
                    Op::ncclMax,
                    comm,
                    s,
                )
            };
            let want = if is_fp8 && !fp8_ok {
                ncclResult_t::ncclInvalidArgument
            } else {
                NCCL_OK
            };
            assert_eq!(rc, want, "{t:?} on NCCL {v}");
        }
        // SAFETY: live handles.
        unsafe {
            assert_eq!((f.cuStreamSynchronize)(s), OK);
            assert_eq!((f.cuMemFree)(buf), OK);
            assert_eq!((f.cuStreamDestroy)(s), OK);
        }
        rig.destroy(comm);
    }
}

/// One rank: NCCL copies the input for every op but a pre-multiplied sum (a float
/// average is one), `ncclLaunchOneRank`'s `cudaMemcpyAsync`: an e5m2 infinity, a NaN's
/// payload and every other code come back as they went, unrounded and unsaturated.
#[test]
fn one_rank_copies_its_input_bit_for_bit() {
    let rig = Rig::new(1);
    let e5m2: Vec<u8> = (0..COUNT)
        .map(|i| [0x7c, 0xfc, 0x7d, 0xfe, 0x01][i % 5])
        .collect();
    let f16: Vec<u8> = (0..COUNT)
        .flat_map(|i| [0x7c01u16, 0xfc00, 0x7e55, 0x3c00][i % 4].to_ne_bytes())
        .collect();
    let ints: Vec<u8> = (0..COUNT).map(|i| (i * 37) as u8).collect();
    for (t, esize, input) in [
        (D::ncclFloat8e5m2, 1, &e5m2),
        (D::ncclFloat16, 2, &f16),
        (D::ncclInt8, 1, &ints),
    ] {
        let mut ops = vec![Op::ncclSum, Op::ncclProd, Op::ncclMin, Op::ncclMax];
        if t == D::ncclInt8 {
            ops.push(Op::ncclAvg);
        }
        for op in ops {
            for coll in [Coll::AllReduce, Coll::Reduce, Coll::ReduceScatter] {
                let out = run(
                    &rig,
                    coll,
                    t,
                    esize,
                    Red::Builtin(op),
                    std::slice::from_ref(input),
                    &[],
                );
                assert_eq!(out[0].as_ref(), Some(input), "{coll:?} {t:?} {op:?}");
            }
        }
    }
}

/// Min and max of a NaN and a number give the number, as NCCL's kernels do (`fmaxf` and
/// `fminf` for float and double, `__hmax`/`__hmin` for half, bfloat16 and fp8 through
/// half); two NaNs give a NaN.
#[test]
fn min_and_max_take_the_number_over_a_nan() {
    let rig = Rig::new(2);
    // (type, element size, a NaN's code, 1.0's code), codes as little-endian u64.
    let cases: [(D, usize, u64, u64); 6] = [
        (D::ncclFloat32, 4, 0x7fc0_0000, 0x3f80_0000),
        (
            D::ncclFloat64,
            8,
            0x7ff8_0000_0000_0000,
            0x3ff0_0000_0000_0000,
        ),
        (D::ncclFloat16, 2, 0x7e00, 0x3c00),
        (D::ncclBfloat16, 2, 0x7fc0, 0x3f80),
        (D::ncclFloat8e4m3, 1, 0x7f, 0x38),
        (D::ncclFloat8e5m2, 1, 0x7e, 0x3c),
    ];
    let is_nan = |t: D, code: u64| match t {
        D::ncclFloat32 => f32::from_bits(code as u32).is_nan(),
        D::ncclFloat64 => f64::from_bits(code).is_nan(),
        D::ncclFloat16 => half::f16::from_bits(code as u16).is_nan(),
        D::ncclBfloat16 => half::bf16::from_bits(code as u16).is_nan(),
        D::ncclFloat8e4m3 => code & 0x7f == 0x7f,
        _ => code & 0x7c == 0x7c && code & 0x03 != 0,
    };
    let fill = |esize: usize, code: u64| -> Vec<u8> {
        (0..COUNT)
            .flat_map(|_| code.to_le_bytes()[..esize].to_vec())
            .collect()
    };
    for (t, esize, nan, one) in cases {
        for op in [Op::ncclMax, Op::ncclMin] {
            for (inputs, want_nan) in [
                ([fill(esize, nan), fill(esize, one)], false),
                ([fill(esize, one), fill(esize, nan)], false),
                ([fill(esize, nan), fill(esize, nan)], true),
            ] {
                let out = run(
                    &rig,
                    Coll::AllReduce,
                    t,
                    esize,
                    Red::Builtin(op),
                    &inputs,
                    &[],
                );
                for got in out.iter().map(|o| o.as_ref().unwrap()) {
                    let mut bytes = [0u8; 8];
                    bytes[..esize].copy_from_slice(&got[..esize]);
                    let code = u64::from_le_bytes(bytes);
                    if want_nan {
                        assert!(is_nan(t, code), "{t:?} {op:?} of two NaNs: {code:#x}");
                    } else {
                        assert_eq!(code, one, "{t:?} {op:?} of a NaN and 1.0");
                        assert_eq!(got, &fill(esize, one), "{t:?} {op:?}: every element");
                    }
                }
            }
        }
    }
}
