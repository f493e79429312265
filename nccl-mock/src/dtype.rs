//! Element arithmetic for the simulated collectives: every `ncclDataType_t`, every op.
//!
//! Values are decoded to a wide type, combined, and encoded back in the element's own
//! precision after each step, as NCCL's kernels do (integers wrap in their own width;
//! half, bfloat16 and fp8 round after every operation; fp8 saturates, as NCCL's
//! `__NV_SATFINITE` conversions do).

use nccl_sys::{ncclDataType_t as D, ncclRedOp_t};

/// The size in bytes of one element, or `None` for a type this simulation does not know.
pub(crate) fn size_of(t: D) -> Option<usize> {
    Some(match t {
        D::ncclInt8 | D::ncclUint8 | D::ncclFloat8e4m3 | D::ncclFloat8e5m2 => 1,
        D::ncclFloat16 | D::ncclBfloat16 => 2,
        D::ncclInt32 | D::ncclUint32 | D::ncclFloat32 => 4,
        D::ncclInt64 | D::ncclUint64 | D::ncclFloat64 => 8,
        _ => return None,
    })
}

/// The C name of a type, for reports (`ncclInt32`); the raw value for one this
/// simulation does not know.
pub(crate) fn name(t: D) -> String {
    let known = match t {
        D::ncclInt8 => "ncclInt8",
        D::ncclUint8 => "ncclUint8",
        D::ncclInt32 => "ncclInt32",
        D::ncclUint32 => "ncclUint32",
        D::ncclInt64 => "ncclInt64",
        D::ncclUint64 => "ncclUint64",
        D::ncclFloat16 => "ncclFloat16",
        D::ncclFloat32 => "ncclFloat32",
        D::ncclFloat64 => "ncclFloat64",
        D::ncclBfloat16 => "ncclBfloat16",
        D::ncclFloat8e4m3 => "ncclFloat8e4m3",
        D::ncclFloat8e5m2 => "ncclFloat8e5m2",
        _ => return format!("type {}", t.0),
    };
    known.to_owned()
}

/// The NCCL release that introduced a type (`None`: in every supported release).
pub(crate) fn introduced(t: D) -> Option<i32> {
    match t {
        D::ncclFloat8e4m3 | D::ncclFloat8e5m2 => Some(nccl_sys::NcclVersion::new(2, 24, 0).0),
        _ => None,
    }
}

/// A decoded element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum V {
    I(i128),
    F(f64),
}

fn is_float(t: D) -> bool {
    matches!(
        t,
        D::ncclFloat16
            | D::ncclBfloat16
            | D::ncclFloat32
            | D::ncclFloat64
            | D::ncclFloat8e4m3
            | D::ncclFloat8e5m2
    )
}

/// Reads element `i` of type `t` from `bytes`.
pub(crate) fn get(t: D, bytes: &[u8], i: usize) -> V {
    let n = size_of(t).unwrap_or(1);
    let b = &bytes[i * n..(i + 1) * n];
    match t {
        D::ncclInt8 => V::I(i128::from(b[0] as i8)),
        D::ncclUint8 => V::I(i128::from(b[0])),
        D::ncclInt32 => V::I(i128::from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
        D::ncclUint32 => V::I(i128::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
        D::ncclInt64 => V::I(i128::from(i64::from_ne_bytes(
            b.try_into().unwrap_or([0; 8]),
        ))),
        D::ncclUint64 => V::I(i128::from(u64::from_ne_bytes(
            b.try_into().unwrap_or([0; 8]),
        ))),
        D::ncclFloat32 => V::F(f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))),
        D::ncclFloat64 => V::F(f64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))),
        D::ncclFloat16 => V::F(f64::from(minifloat_decode(
            u16::from_ne_bytes([b[0], b[1]]).into(),
            5,
            10,
            false,
        ))),
        D::ncclBfloat16 => V::F(f64::from(f32::from_bits(
            u32::from(u16::from_ne_bytes([b[0], b[1]])) << 16,
        ))),
        D::ncclFloat8e4m3 => V::F(f64::from(minifloat_decode(b[0].into(), 4, 3, true))),
        D::ncclFloat8e5m2 => V::F(f64::from(minifloat_decode(b[0].into(), 5, 2, false))),
        _ => V::I(0),
    }
}

/// Writes `v` as element `i` of type `t` into `bytes`, rounding/wrapping to the type.
pub(crate) fn put(t: D, bytes: &mut [u8], i: usize, v: V) {
    let n = size_of(t).unwrap_or(1);
    let out = &mut bytes[i * n..(i + 1) * n];
    let as_int = |v: V| match v {
        V::I(x) => x,
        V::F(f) => f as i128,
    };
    let as_f = |v: V| match v {
        V::I(x) => x as f64,
        V::F(f) => f,
    };
    match t {
        D::ncclInt8 | D::ncclUint8 => out[0] = as_int(v) as u8,
        D::ncclInt32 | D::ncclUint32 => out.copy_from_slice(&(as_int(v) as u32).to_ne_bytes()),
        D::ncclInt64 | D::ncclUint64 => out.copy_from_slice(&(as_int(v) as u64).to_ne_bytes()),
        D::ncclFloat32 => out.copy_from_slice(&(as_f(v) as f32).to_ne_bytes()),
        D::ncclFloat64 => out.copy_from_slice(&as_f(v).to_ne_bytes()),
        D::ncclFloat16 => out.copy_from_slice(&f16_encode(as_f(v) as f32).to_ne_bytes()),
        D::ncclBfloat16 => out.copy_from_slice(&bf16_encode(as_f(v) as f32).to_ne_bytes()),
        D::ncclFloat8e4m3 => out[0] = minifloat_encode(as_f(v) as f32, 4, 3, true) as u8,
        D::ncclFloat8e5m2 => out[0] = minifloat_encode(as_f(v) as f32, 5, 2, false) as u8,
        _ => {}
    }
}

/// Rounds `v` to what type `t` can hold (so each step of a reduction rounds like NCCL).
pub(crate) fn round(t: D, v: V) -> V {
    let mut buf = [0u8; 8];
    put(t, &mut buf, 0, v);
    get(t, &buf, 0)
}

/// Combines two elements with a built-in op (sum, prod, max, min).
pub(crate) fn combine(t: D, op: ncclRedOp_t, a: V, b: V) -> V {
    let r = match (a, b) {
        (V::I(x), V::I(y)) => V::I(match op {
            ncclRedOp_t::ncclProd => x.wrapping_mul(y),
            ncclRedOp_t::ncclMax => x.max(y),
            ncclRedOp_t::ncclMin => x.min(y),
            _ => x.wrapping_add(y),
        }),
        (V::F(x), V::F(y)) => V::F(match op {
            ncclRedOp_t::ncclProd => x * y,
            // NCCL's fmaxf/fminf (float, double; half below sm_80) and __hmax/__hmin
            // (half, bfloat16, fp8 through half): a NaN loses to a number, as with Rust's.
            ncclRedOp_t::ncclMax => x.max(y),
            ncclRedOp_t::ncclMin => x.min(y),
            _ => x + y,
        }),
        _ => a,
    };
    round(t, r)
}

/// Multiplies by a scalar (pre-multiplied sums; `avg` for floats).
pub(crate) fn scale(t: D, a: V, s: V) -> V {
    if is_float(t) {
        let (V::F(x), V::F(y)) = (to_f(a), to_f(s)) else {
            return a;
        };
        round(t, V::F(x * y))
    } else {
        combine(t, ncclRedOp_t::ncclProd, a, s)
    }
}

/// The scalar a float `ncclAvg` pre-multiplies each rank's input by: 1/n rounded to the
/// type, as NCCL's `hostToDevRedOp` computes it (`float(1.0/nRanks)` converted to the
/// type; a double's is `1.0/nRanks`).
pub(crate) fn avg_scalar(t: D, n: usize) -> V {
    round(t, V::F(1.0 / n.max(1) as f64))
}

/// Integer average: the wrapped sum divided by `n`, truncating toward zero. (A float
/// average pre-multiplies instead: [`avg_scalar`].)
pub(crate) fn divide(t: D, a: V, n: i128) -> V {
    match a {
        V::I(x) => round(t, V::I(x / n.max(1))),
        V::F(_) => a,
    }
}

pub(crate) fn is_float_type(t: D) -> bool {
    is_float(t)
}

fn to_f(v: V) -> V {
    match v {
        V::I(x) => V::F(x as f64),
        f => f,
    }
}

/// Decodes an IEEE-style minifloat with `e` exponent and `m` mantissa bits. `fn_style`:
/// no infinities, the all-ones pattern is NaN (fp8 e4m3fn).
fn minifloat_decode(bits: u32, e: u32, m: u32, fn_style: bool) -> f32 {
    let sign = if bits >> (e + m) & 1 == 1 { -1.0 } else { 1.0 };
    let exp = (bits >> m) & ((1 << e) - 1);
    let man = bits & ((1 << m) - 1);
    let bias = (1i32 << (e - 1)) - 1;
    let max_exp = (1 << e) - 1;
    if exp == max_exp {
        if fn_style {
            if man == (1 << m) - 1 {
                return f32::NAN;
            }
        } else if man == 0 {
            return sign * f32::INFINITY;
        } else {
            return f32::NAN;
        }
    }
    let frac = man as f32 / (1u32 << m) as f32;
    if exp == 0 {
        sign * frac * 2f32.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f32.powi(exp as i32 - bias)
    }
}

/// Encodes with round-to-nearest-even, saturating to the largest finite value (fp8 only:
/// it searches all codes). NCCL converts every fp8 result with CUDA's `__NV_SATFINITE`
/// (`__nv_fp8_e4m3(__half)`, `__nv_fp8_e5m2(__half)`), so an e5m2 result past 57344, an
/// infinite one included, is 57344 too: only an infinite input that is copied keeps it.
fn minifloat_encode(x: f32, e: u32, m: u32, fn_style: bool) -> u32 {
    let sign_bit = u32::from(x.is_sign_negative()) << (e + m);
    let max_exp = (1u32 << e) - 1;
    if x.is_nan() {
        return sign_bit | (max_exp << m) | ((1 << m) - 1);
    }
    let codes = 1u32 << (e + m);
    let finite = |code: &u32| minifloat_decode(*code, e, m, fn_style).is_finite();
    // e4m3fn's largest is S.1111.110 (S.1111.111 is NaN), an IEEE-style one's S.11110.11.
    let max_code = if fn_style {
        (max_exp << m) | ((1 << m) - 2)
    } else {
        ((max_exp - 1) << m) | ((1 << m) - 1)
    };
    let max_finite = minifloat_decode(max_code, e, m, fn_style);
    // Nearest finite value to the saturated magnitude, ties to the even code.
    let a = x.abs().min(max_finite);
    let mut best = 0u32;
    let mut best_err = f32::INFINITY;
    for code in (0..codes).filter(finite) {
        let err = (minifloat_decode(code, e, m, fn_style) - a).abs();
        if err < best_err || (err == best_err && code & 1 == 0) {
            best = code;
            best_err = err;
        }
    }
    sign_bit | best
}

/// IEEE half from f32, round to nearest even (bit arithmetic: fast enough for big buffers).
fn f16_encode(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let rounded = m + (1 << (shift - 1)) - 1 + ((m >> shift) & 1);
        return sign | (rounded >> shift) as u16;
    }
    let rounded = man + 0xfff + ((man >> 13) & 1);
    let (mut e2, mut m2) = (e as u32, rounded);
    if m2 & 0x80_0000 != 0 {
        m2 = 0;
        e2 += 1;
        if e2 >= 0x1f {
            return sign | 0x7c00;
        }
    }
    sign | ((e2 << 10) as u16) | ((m2 >> 13) as u16)
}

fn bf16_encode(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fc0;
    }
    let bits = x.to_bits();
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

// Independent references shared with the integration tests.
#[cfg(test)]
use test_support::{ocp_fp8, splitmix};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_c_name() {
        let named: Vec<String> = (0..12).map(|t| name(D(t))).collect();
        assert_eq!(
            named,
            [
                "ncclInt8",
                "ncclUint8",
                "ncclInt32",
                "ncclUint32",
                "ncclInt64",
                "ncclUint64",
                "ncclFloat16",
                "ncclFloat32",
                "ncclFloat64",
                "ncclBfloat16",
                "ncclFloat8e4m3",
                "ncclFloat8e5m2"
            ]
        );
        assert_eq!(name(D(99)), "type 99");
    }

    #[test]
    fn f16_rounds_up_into_infinity_past_its_largest_finite_value() {
        // 65504 is f16's largest; from 65520 (half an ulp above) a sum rounds to infinity.
        assert_eq!(round(D::ncclFloat16, V::F(65519.0)), V::F(65504.0));
        assert_eq!(round(D::ncclFloat16, V::F(65520.0)), V::F(f64::INFINITY));
        assert_eq!(
            round(D::ncclFloat16, V::F(-65520.0)),
            V::F(f64::NEG_INFINITY)
        );
        assert_eq!(round(D::ncclFloat16, V::F(1e6)), V::F(f64::INFINITY));
    }

    #[test]
    fn small_floats_round_trip_exactly() {
        for t in [
            D::ncclFloat16,
            D::ncclBfloat16,
            D::ncclFloat8e4m3,
            D::ncclFloat8e5m2,
        ] {
            for x in [-3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 3.0, 6.0, 12.0] {
                assert_eq!(round(t, V::F(x)), V::F(x), "{t:?} {x}");
            }
        }
        assert_eq!(round(D::ncclFloat8e4m3, V::F(1000.0)), V::F(448.0));
        assert_eq!(round(D::ncclFloat8e5m2, V::F(1e6)), V::F(57344.0));
        assert_eq!(round(D::ncclFloat16, V::F(65504.0)), V::F(65504.0));
        assert_eq!(round(D::ncclFloat16, V::F(1e6)), V::F(f64::INFINITY));
        assert_eq!(
            round(D::ncclFloat16, V::F(1.0 + 1.0 / 4096.0)),
            V::F(1.0),
            "ties to even"
        );
        assert_eq!(
            round(D::ncclFloat16, V::F(2f64.powi(-24))),
            V::F(2f64.powi(-24)),
            "subnormal"
        );
        assert_eq!(round(D::ncclFloat16, V::F(0.1)), V::F(0.0999755859375));
    }

    #[test]
    fn integers_wrap_in_their_width() {
        let t = D::ncclInt8;
        assert_eq!(
            combine(t, ncclRedOp_t::ncclSum, V::I(127), V::I(1)),
            V::I(-128)
        );
        let u = D::ncclUint64;
        assert_eq!(
            combine(u, ncclRedOp_t::ncclSum, V::I(u64::MAX as i128), V::I(2)),
            V::I(1)
        );
        assert_eq!(
            combine(u, ncclRedOp_t::ncclMax, V::I(u64::MAX as i128), V::I(2)),
            V::I(u64::MAX as i128)
        );
    }

    /// NCCL's fp8 reductions convert with `__NV_SATFINITE`: e5m2 too stops at ±57344,
    /// an infinite intermediate included (an infinity used to encode as 49152).
    #[test]
    fn e5m2_saturates_like_nccl() {
        let t = D::ncclFloat8e5m2;
        for (x, want) in [
            (57344.0, 57344.0),
            (61440.0, 57344.0),
            (1e6, 57344.0),
            (f64::INFINITY, 57344.0),
            (f64::NEG_INFINITY, -57344.0),
            (-1e9, -57344.0),
        ] {
            assert_eq!(round(t, V::F(x)), V::F(want), "{x}");
        }
        let inf = V::F(f64::INFINITY);
        assert_eq!(
            combine(t, ncclRedOp_t::ncclSum, inf, V::F(1.0)),
            V::F(57344.0)
        );
        assert_eq!(round(D::ncclFloat8e4m3, inf), V::F(448.0));
        assert!(matches!(round(t, V::F(f64::NAN)), V::F(x) if x.is_nan()));
    }

    /// The value `get` decodes from one element's bytes, as f64.
    fn value(t: D, bytes: &[u8]) -> f64 {
        match get(t, bytes, 0) {
            V::F(x) => x,
            V::I(_) => panic!("{t:?} is a float type"),
        }
    }

    /// `x` stored by `put` as type `t`, the element's bytes.
    fn stored(t: D, x: f64) -> Vec<u8> {
        let mut b = vec![0u8; size_of(t).unwrap_or(1)];
        put(t, &mut b, 0, V::F(x));
        b
    }

    /// Same value, NaN matching NaN and zeros matching by sign.
    fn same(a: f64, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
    }

    /// Every f16 and bf16 code decodes as the `half` crate decodes it, and (NaN aside)
    /// stores back to the same code.
    #[test]
    fn every_f16_and_bf16_code_decodes_as_half_and_round_trips() {
        for code in 0..=u16::MAX {
            let b = code.to_ne_bytes();
            let h = half::f16::from_bits(code).to_f64();
            let bf = half::bf16::from_bits(code).to_f64();
            assert!(same(value(D::ncclFloat16, &b), h), "f16 {code:#06x}");
            assert!(same(value(D::ncclBfloat16, &b), bf), "bf16 {code:#06x}");
            for (t, v) in [(D::ncclFloat16, h), (D::ncclBfloat16, bf)] {
                let back = stored(t, v);
                if v.is_nan() {
                    assert!(value(t, &back).is_nan(), "{t:?} {code:#06x}");
                } else {
                    assert_eq!(back, b, "{t:?} {code:#06x} stores back");
                }
            }
        }
    }

    /// Storing an f32 as f16 or bf16 rounds as `half` does (to nearest, ties to even):
    /// every midpoint between two adjacent codes (the ties), and pseudo-random f32s.
    #[test]
    fn f16_and_bf16_store_rounds_as_half() {
        let check = |x: f32| {
            let h = half::f16::from_f32(x).to_f64();
            let bf = half::bf16::from_f32(x).to_f64();
            let x = f64::from(x);
            assert!(
                same(value(D::ncclFloat16, &stored(D::ncclFloat16, x)), h),
                "f16 of {x:e}"
            );
            assert!(
                same(value(D::ncclBfloat16, &stored(D::ncclBfloat16, x)), bf),
                "bf16 of {x:e}"
            );
        };
        for code in 0..0x7bffu16 {
            let (a, b) = (half::f16::from_bits(code), half::f16::from_bits(code + 1));
            // Exact in f32 (12 significant bits), either sign.
            let mid = (a.to_f32() + b.to_f32()) / 2.0;
            check(mid);
            check(-mid);
        }
        for code in 0..0x7f7fu16 {
            let (a, b) = (half::bf16::from_bits(code), half::bf16::from_bits(code + 1));
            let mid = (a.to_f32() + b.to_f32()) / 2.0;
            check(mid);
            check(-mid);
        }
        let mut rng = super::splitmix::SplitMix(0x5eed_f16b);
        for _ in 0..200_000 {
            check(f32::from_bits(rng.next() as u32));
        }
    }

    /// Every fp8 code decodes as the OCP spec's fields say, and stores back to the same
    /// code; except NaN (stays NaN) and e5m2's infinities, which store as ±57344 since
    /// results saturate as NCCL's do.
    #[test]
    fn every_fp8_code_decodes_as_the_ocp_spec_and_round_trips() {
        for (t, spec) in [
            (D::ncclFloat8e4m3, super::ocp_fp8::E4M3),
            (D::ncclFloat8e5m2, super::ocp_fp8::E5M2),
        ] {
            for code in 0..=u8::MAX {
                let v = spec.value(code);
                assert!(same(value(t, &[code]), v), "{t:?} {code:#04x}");
                let back = value(t, &stored(t, v));
                if v.is_nan() {
                    assert!(back.is_nan(), "{t:?} {code:#04x}");
                } else if v.is_infinite() {
                    assert_eq!(back, 57344f64.copysign(v), "{t:?} {code:#04x}");
                } else {
                    assert_eq!(stored(t, v), [code], "{t:?} {code:#04x} stores back");
                }
            }
        }
    }

    /// Storing as fp8 rounds as the spec's table says (nearest, ties to even, saturating):
    /// every midpoint between adjacent values, values past the largest, and
    /// pseudo-random f32s across the range.
    #[test]
    fn fp8_store_rounds_as_the_ocp_spec() {
        for (t, spec) in [
            (D::ncclFloat8e4m3, super::ocp_fp8::E4M3),
            (D::ncclFloat8e5m2, super::ocp_fp8::E5M2),
        ] {
            let check = |x: f64| {
                let want = spec.round(x);
                let got = value(t, &stored(t, x));
                assert!(same(got, want), "{t:?} of {x:e}: {got} != {want}");
            };
            let mut values: Vec<f64> = (0..0x80u8)
                .map(|c| spec.value(c))
                .filter(|v| v.is_finite())
                .collect();
            values.sort_by(f64::total_cmp);
            for w in values.windows(2) {
                for x in [(w[0] + w[1]) / 2.0, w[0] * 0.75 + w[1] * 0.25, w[1]] {
                    check(x);
                    check(-x);
                }
            }
            for x in [spec.max() * 1.03, spec.max() * 1.2, 1e6, f64::INFINITY] {
                check(x);
                check(-x);
            }
            let mut rng = super::splitmix::SplitMix(0xf8);
            for _ in 0..20_000 {
                // Magnitudes 2^-20 .. 2^20, any sign.
                let e = rng.below(41) as i32 - 20;
                let m = 1.0 + rng.below(1 << 20) as f64 / (1 << 20) as f64;
                let s = if rng.next() & 1 == 1 { -1.0 } else { 1.0 };
                check(f64::from((s * m * 2f64.powi(e)) as f32));
            }
        }
    }
}
