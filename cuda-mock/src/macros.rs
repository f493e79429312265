//! `mock_fns!`: declares simulated driver functions, one instance per world slot.
//!
//! A C function pointer carries no state, so every function is generic over the slot `W`
//! of its world. The macro adds what every entry point does first (find the world, run a
//! test's code due before the call, take its lock, count the call, apply a queued fault,
//! require `cuInit`) and a `lookup` that
//! maps the functions' table names to their instance for slot `W`, typed with the table's
//! exact signature so a mismatch fails to compile. Each domain module invokes it once;
//! `resolver::lookup` asks each module's `lookup` in turn.

/// `fn cuName = rust_name(w, s, args..) [init|any] { body }`: `w` is the `&World`, `s` its
/// locked `State` guard; `[init]` functions fail with `CUDA_ERROR_NOT_INITIALIZED` before
/// `cuInit`.
macro_rules! mock_fns {
    ($(
        fn $cname:ident = $rname:ident ($w:ident, $s:ident $(, $a:ident : $t:ty)*) [$init:tt] $body:block
    )*) => {
        $(
            #[allow(non_snake_case, clippy::needless_return)]
            unsafe extern "C" fn $rname<const W: usize>($($a: $t),*) -> cuda_sys::CUresult {
                let Some(world) = crate::world::slot_world_of(W) else {
                    return cuda_sys::CUresult::CUDA_ERROR_DEINITIALIZED;
                };
                let $w: &crate::world::World = &world;
                // A lookup's detail is for the error text asked for right after it.
                if !matches!(stringify!($cname), "cuGetErrorString" | "cuGetErrorName") {
                    crate::detail::clear();
                }
                // A test's code for this call, outside the lock (`MockWorld::before_call`).
                $w.before.run(stringify!($cname));
                #[allow(unused_mut)]
                let mut $s = $w.lock();
                if let Some(e) = $s.enter(stringify!($cname)) {
                    return e;
                }
                if mock_fns!(@needs_init $init) && !$s.initialized {
                    return cuda_sys::CUresult::CUDA_ERROR_NOT_INITIALIZED;
                }
                $body
            }
        )*

        /// This module's function named `name` for slot `W`, or null.
        pub(super) fn lookup<const W: usize>(name: &[u8]) -> *const ::std::ffi::c_void {
            $(
                if name == stringify!($cname).as_bytes() {
                    let f: cuda_sys::signatures::$cname = $rname::<W>;
                    return f as *const ::std::ffi::c_void;
                }
            )*
            ::std::ptr::null()
        }
    };
    (@needs_init init) => { true };
    (@needs_init any) => { false };
}

pub(super) use mock_fns;
