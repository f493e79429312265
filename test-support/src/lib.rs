//! What the workspace's tests share, as a crate instead of files included by path: each
//! crate's tests take it as a dev-dependency. It depends on none of the workspace's crates,
//! so any of them, the simulators included, can use it in its unit tests too.
#![allow(
    missing_docs,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod dropin;
pub mod env;
pub mod ocp_fp8;
pub mod splitmix;
pub mod stubcc;

/// The name libtest gives the test function `name` of the module `module` (the caller's
/// `module_path!()`, whose first part is the test crate and not part of a test's name).
///
/// ```
/// assert_eq!(test_support::test_name("suite::loader", "f"), "loader::f");
/// assert_eq!(test_support::test_name("suite", "f"), "f");
/// ```
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, rest)) => format!("{rest}::{name}"),
        None => name.to_string(),
    }
}

/// [`env::in_scrubbed_child`] for the test `name` of the calling module: the child is asked
/// for the test by its full name in the test binary (`module::name`), wherever the module
/// sits.
#[macro_export]
macro_rules! in_scrubbed_child {
    ($name:expr, $env:expr $(,)?) => {
        $crate::env::in_scrubbed_child(&$crate::test_name(module_path!(), $name), $env)
    };
}

/// The name libtest gives the test this is written in (the function around it).
#[macro_export]
macro_rules! this_test {
    () => {{
        fn here() {}
        $crate::test_name_around(::std::any::type_name_of_val(&here))
    }};
}

/// [`in_scrubbed_child!`] for the test it is written in, named by the function around it:
/// the test starts with `if !test_support::this_test_in_scrubbed_child!(&[]) { return; }`.
#[macro_export]
macro_rules! this_test_in_scrubbed_child {
    ($env:expr $(,)?) => {
        $crate::env::in_scrubbed_child(&$crate::this_test!(), $env)
    };
}

/// The name libtest gives the test whose body holds the item at `path` (its
/// `type_name`: the test crate, the test's path, the item's name).
///
/// ```
/// assert_eq!(test_support::test_name_around("suite::loader::f::here"), "loader::f");
/// assert_eq!(test_support::test_name_around("suite::f::here"), "f");
/// ```
pub fn test_name_around(path: &str) -> String {
    let test = path.rsplit_once("::").map_or(path, |(test, _)| test);
    test.split_once("::")
        .map_or(test, |(_, rest)| rest)
        .to_string()
}

/// Whether a GPU test has the GPUs it needs; when not, says "skipped: needs N GPUs" on
/// stdout (the test then returns and passes: a one-GPU machine is not a failure).
///
/// ```
/// assert!(test_support::enough_gpus(2, 2));
/// assert!(!test_support::enough_gpus(1, 2));
/// ```
pub fn enough_gpus(have: usize, need: usize) -> bool {
    if have < need {
        println!("skipped: needs {need} GPUs, this machine has {have}");
        return false;
    }
    true
}
