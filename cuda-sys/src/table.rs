//! The `fn_table!` macro that declares a function table and its resolver-driven loader.
//!
//! A table is a plain struct of `unsafe extern "C" fn` pointers (required entries) and
//! `Option`s of them (entries newer than the minimum library version). It is filled by one
//! resolver closure `(name, api_version) -> address`, which is how real libraries
//! (`dlsym`, `cuGetProcAddress`) and mock tables are both plugged in. A call through the
//! table is a plain indirect call: no lock, no lookup.

use std::ffi::CStr;

/// A resolver: given a symbol name and the API version it is wanted at, its address, or null.
///
/// What a table's `load_with` asks, entry by entry; a resolver that finds nothing fails
/// at the first required entry:
///
/// ```
/// use std::ffi::CStr;
/// use cuda_sys::{DriverFns, PINNED_API_VERSION, Resolver};
///
/// let mut asked = Vec::new();
/// let mut nothing = |name: &CStr, version: i32| {
///     asked.push((name.to_owned(), version));
///     std::ptr::null()
/// };
/// let resolver: &mut Resolver<'_> = &mut nothing;
/// // SAFETY: a resolver that returns no address makes no signature promise.
/// let table = unsafe { DriverFns::load_with(PINNED_API_VERSION, resolver) };
/// assert_eq!(table.err(), Some("cuInit"));
/// assert_eq!(asked, [(c"cuInit".to_owned(), PINNED_API_VERSION)]);
/// ```
pub type Resolver<'a> = dyn FnMut(&CStr, i32) -> *const core::ffi::c_void + 'a;

/// Turns a NUL-terminated literal into a `&CStr` at compile time (used by `fn_table!`).
#[doc(hidden)]
pub const fn cstr(s: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(s.as_bytes()) {
        Ok(c) => c,
        // Only reachable at compile time, from a malformed literal written in this crate.
        #[allow(clippy::panic)]
        Err(_) => panic!("symbol literal must end in one NUL"),
    }
}

/// Declares a function table: `required` entries resolved at version `min`, `optional`
/// entries at the version that introduced each (and only from a library at least that new).
///
/// ```text
/// fn_table! {
///     /// docs
///     pub struct Name;
///     min = <i32 expression>;
///     required { symbol: SignatureType, ... }
///     optional { symbol: SignatureType = <version>, ... }
/// }
/// ```
///
/// It declares the struct (a required entry is a function pointer, an optional one an
/// `Option` of it) with `REQUIRED`, `OPTIONAL`, `SIGNATURES`, `load_with` (fills it
/// through a [`Resolver`](crate::Resolver)), `address_of` and `optional_present`, a
/// `Debug` impl, and a hidden module `signatures` with one type alias per entry (so one
/// table per module). A table becomes loadable with a [`Table`](crate::dylib::Table)
/// impl: see the [`dylib`](crate::dylib) example; [`DriverFns`](crate::DriverFns) is one.
#[macro_export]
macro_rules! fn_table {
    (
        $(#[$meta:meta])*
        pub struct $name:ident;
        min = $min:expr;
        required { $( $rf:ident : $rty:ty ),* $(,)? }
        optional { $( $of:ident : $oty:ty = $ov:expr ),* $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        #[allow(non_snake_case)]
        pub struct $name {
            $(
                #[doc = concat!("`", stringify!($rf), "` (required).")]
                pub $rf: $rty,
            )*
            $(
                #[doc = concat!("`", stringify!($of), "`: `Some` when the library is at \
                    least version `", stringify!($ov), "` (see [`OPTIONAL`](Self::OPTIONAL)) \
                    and exports it.")]
                pub $of: Option<$oty>,
            )*
        }

        impl $name {
            /// Names of the required entries.
            pub const REQUIRED: &'static [&'static str] = &[$(stringify!($rf)),*];
            /// Names of the optional entries with the version that introduced each.
            pub const OPTIONAL: &'static [(&'static str, i32)] = &[$((stringify!($of), $ov)),*];
            /// Every entry's name with the name of its signature type (`PFN_<symbol>`), which
            /// names the exact ABI variant the entry must resolve to.
            pub const SIGNATURES: &'static [(&'static str, &'static str)] =
                &[$((stringify!($rf), stringify!($rty)),)* $((stringify!($of), stringify!($oty))),*];

            /// Fills the table through `resolve(name, api_version)`.
            ///
            /// Required entries are asked for at the minimum version; an optional entry is
            /// asked for only when `version` is at least the one that introduced it, and is
            /// `None` when the resolver returns null. Returns the name of the first required
            /// entry the resolver could not find.
            ///
            /// # Safety
            /// Every non-null address returned for a name must be a function with exactly
            /// the signature that the table declares for it, and must stay valid as long as
            /// the table is used.
            pub unsafe fn load_with(
                version: i32,
                resolve: &mut $crate::table::Resolver<'_>,
            ) -> ::core::result::Result<Self, &'static str> {
                Ok(Self {
                    $(
                        $rf: {
                            const NAME: &::std::ffi::CStr =
                                $crate::table::cstr(concat!(stringify!($rf), "\0"));
                            let p = resolve(NAME, $min);
                            if p.is_null() {
                                return Err(stringify!($rf));
                            }
                            // SAFETY: non-null, and the caller promises the address is a
                            // function of this entry's signature.
                            unsafe { ::core::mem::transmute::<*const ::core::ffi::c_void, $rty>(p) }
                        },
                    )*
                    $(
                        $of: {
                            const NAME: &::std::ffi::CStr =
                                $crate::table::cstr(concat!(stringify!($of), "\0"));
                            let p = if version >= $ov { resolve(NAME, $ov) } else { ::core::ptr::null() };
                            if p.is_null() {
                                None
                            } else {
                                // SAFETY: as above.
                                Some(unsafe { ::core::mem::transmute::<*const ::core::ffi::c_void, $oty>(p) })
                            }
                        },
                    )*
                })
            }

            /// The address an entry was resolved to, by entry name (`None`: no such entry,
            /// or an optional entry that is absent). For checks and diagnostics.
            pub fn address_of(&self, name: &str) -> Option<*const ::core::ffi::c_void> {
                $(
                    if name == stringify!($rf) {
                        return Some(self.$rf as *const ::core::ffi::c_void);
                    }
                )*
                $(
                    if name == stringify!($of) {
                        return self.$of.map(|f| f as *const ::core::ffi::c_void);
                    }
                )*
                None
            }

            /// Each optional entry's name with whether it was resolved.
            pub fn optional_present(&self) -> ::std::vec::Vec<(&'static str, bool)> {
                vec![$((stringify!($of), self.$of.is_some())),*]
            }
        }

        /// Each entry's signature under the entry's name, for implementations of the table
        /// (such as simulators) to be checked against it at compile time.
        #[allow(non_camel_case_types, unreachable_pub, dead_code, missing_docs)]
        pub mod signatures {
            use super::*;
            $( pub type $rf = $rty; )*
            $( pub type $of = $oty; )*
        }

        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                let present: ::std::vec::Vec<&str> = self
                    .optional_present()
                    .into_iter()
                    .filter_map(|(n, p)| p.then_some(n))
                    .collect();
                f.debug_struct(stringify!($name))
                    .field("required", &Self::REQUIRED.len())
                    .field("optional_present", &present)
                    .finish()
            }
        }
    };
}
