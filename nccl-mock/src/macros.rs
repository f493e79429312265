//! `mock_fns!`: declares simulated NCCL functions, one instance per world slot, with what every entry point does first; below every domain module, which invokes it once.

/// Declares simulated NCCL functions and a `lookup` that finds them by C name.
///
/// Each `fn ncclName = rust_name(w, s, args...) { body }` becomes an
/// `unsafe extern "C" fn rust_name<const W: usize>(args...) -> ncclResult_t` that finds
/// slot `W`'s world (`w`), locks its state (`s`), counts the call and applies injected
/// faults before `body` runs; `CALL` is the C name, for reports. `lookup` checks each
/// function against its table type.
macro_rules! mock_fns {
    ($(
        fn $cname:ident = $rname:ident ($w:ident, $s:ident $(, $a:ident : $t:ty)*) $body:block
    )*) => {
        $(
            #[allow(non_snake_case)]
            unsafe extern "C" fn $rname<const W: usize>($($a: $t),*) -> nccl_sys::ncclResult_t {
                let Some(world) = crate::world::world(W) else {
                    return nccl_sys::ncclResult_t::ncclInternalError;
                };
                /// The C name, for reports.
                #[allow(dead_code)]
                const CALL: &str = stringify!($cname);
                let $w: &crate::world::NWorld = &world;
                #[allow(unused_mut)]
                let mut $s = $w.lock();
                if let Some(e) = $s.enter(stringify!($cname)) {
                    crate::thread_groups::after_fault($w, &mut $s, stringify!($cname), e);
                    return e;
                }
                $body
            }
        )*

        /// This module's function named `name` for slot `W`, or null.
        pub(super) fn lookup<const W: usize>(name: &[u8]) -> *const ::std::ffi::c_void {
            $(
                if name == stringify!($cname).as_bytes() {
                    let f: nccl_sys::signatures::$cname = $rname::<W>;
                    return f as *const ::std::ffi::c_void;
                }
            )*
            ::std::ptr::null()
        }
    };
}
pub(super) use mock_fns;
