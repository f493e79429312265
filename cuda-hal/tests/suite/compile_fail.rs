//! What the types forbid, checked by the compiler (trybuild): each file under
//! `tests/compile_fail/` must fail to build with the error in its `.stderr` beside it.
//! Regenerate the expected errors with `TRYBUILD=overwrite` after a compiler upgrade.

#[test]
fn forbidden_by_the_types() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
}

/// What only the `cudarc` feature brings (`tests/compile_fail_cudarc/`).
#[cfg(feature = "cudarc")]
#[test]
fn forbidden_by_the_types_with_cudarc() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail_cudarc/*.rs");
}
