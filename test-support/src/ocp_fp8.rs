//! The OCP 8-bit floating point formats (OFP8 v1.0) from the spec's fields: an
//! independent reference for the mock's fp8 arithmetic. Shared by the integration tests
//! and `src/mock/dtype.rs`'s unit tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

/// One OCP fp8 format.
#[derive(Clone, Copy, Debug)]
pub struct Fp8 {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// E5M2 has IEEE infinities and NaNs (exponent all ones); E4M3 ("E4M3FN") has no
    /// infinity and one NaN per sign, S.1111.111.
    ieee_specials: bool,
}

pub const E4M3: Fp8 = Fp8 {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    ieee_specials: false,
};

pub const E5M2: Fp8 = Fp8 {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    ieee_specials: true,
};

impl Fp8 {
    /// The value of `code`: (-1)^S * 2^(1-bias) * 0.M for a zero exponent field,
    /// (-1)^S * 2^(E-bias) * 1.M otherwise, with the format's special codes.
    pub fn value(self, code: u8) -> f64 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = (u32::from(code) >> self.man_bits) & ((1 << self.exp_bits) - 1);
        let m = u32::from(code) & ((1 << self.man_bits) - 1);
        let e_max = (1 << self.exp_bits) - 1;
        let m_max = (1 << self.man_bits) - 1;
        if e == e_max && self.ieee_specials {
            return if m == 0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if e == e_max && m == m_max {
            return f64::NAN;
        }
        let frac = f64::from(m) / f64::from(1u32 << self.man_bits);
        if e == 0 {
            sign * frac * 2f64.powi(1 - self.bias)
        } else {
            sign * (1.0 + frac) * 2f64.powi(e as i32 - self.bias)
        }
    }

    /// The largest finite value (448 for E4M3, 57344 for E5M2).
    pub fn max(self) -> f64 {
        (0..=0x7f)
            .map(|c| self.value(c))
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
    }

    /// `x` rounded to the nearest value of the table, ties to the even mantissa, and
    /// saturated to ±max (an infinity too): CUDA's `__NV_SATFINITE`, which NCCL's fp8
    /// kernels convert with (the spec's saturating mode). NaN stays NaN.
    pub fn round(self, x: f64) -> f64 {
        if x.is_nan() {
            return f64::NAN;
        }
        let a = x.abs().min(self.max());
        let mut best = (f64::INFINITY, 0.0);
        for code in 0..=0x7fu8 {
            let v = self.value(code);
            if !v.is_finite() {
                continue;
            }
            let err = (v - a).abs();
            // The codes of one sign increase with the value: an even code has an even
            // mantissa.
            if err < best.0 || (err == best.0 && code % 2 == 0) {
                best = (err, v);
            }
        }
        best.1.copysign(x)
    }
}
