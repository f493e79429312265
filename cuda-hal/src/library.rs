//! [`Library`]: context-independent device code (`cuLibraryLoadData`), loaded once for
//! every context, and its [`Kernel`]s.

use std::ffi::{CStr, CString, c_void};
use std::fmt;

use cuda_sys::{CUdeviceptr, CUfunction, CUkernel, CUlibrary};

use crate::code::{Code, Handle};
use crate::module::c_name;
use crate::{Context, Cuda, DeviceRepr, Error, Function, Global, Result};

/// Device code loaded once for all contexts: the driver loads it into a context the first
/// time one of its kernels or globals is used there.
///
/// Its [`Kernel`]s, and the [`Function`]s they give in each context, borrow it; work that
/// launched its kernels keeps it loaded, as for a [`Module`](crate::Module).
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, Library};
/// let (cuda, _world) = MockDriver::with_devices(2).kernel("noop", &[], |_| {}).build_with(Cuda::from_driver)?;
/// let lib = Library::from_ptx(&cuda, ".version 8.0\n.target sm_90\n.entry noop() { ret; }")?;
/// let noop = lib.kernel("noop")?;
/// for device in cuda.devices()? {
///     let f = noop.function(&device.primary_context()?)?;
///     assert_eq!(f.max_threads_per_block()?, 1024);
/// }
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct Library {
    code: Code,
}

static_assertions::assert_impl_all!(Library: Send, Sync, std::fmt::Debug);

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library").finish_non_exhaustive()
    }
}

impl Library {
    /// Loads PTX text.
    #[doc(alias = "cuLibraryLoadData")]
    pub fn from_ptx(cuda: &Cuda, ptx: &str) -> Result<Library> {
        let text = CString::new(ptx).map_err(|_| Error::InvalidArgument {
            what: "Library::from_ptx",
            problem: "PTX text must not contain a NUL byte".into(),
        })?;
        Self::from_ptx_cstr(cuda, &text)
    }

    /// Loads NUL-terminated PTX text.
    #[doc(alias = "cuLibraryLoadData")]
    pub fn from_ptx_cstr(cuda: &Cuda, ptx: &CStr) -> Result<Library> {
        // SAFETY: a NUL-terminated string is a complete image.
        unsafe { Self::load(cuda, ptx.as_ptr().cast()) }
    }

    /// Loads a cubin or a fatbin.
    ///
    /// # Safety
    /// As for [`Module::from_binary`](crate::Module::from_binary): `image` is one
    /// complete image, whose headers claim no more than the slice holds.
    #[doc(alias = "cuLibraryLoadData")]
    pub unsafe fn from_binary(cuda: &Cuda, image: &[u8]) -> Result<Library> {
        // SAFETY: the caller's contract.
        unsafe { Self::load(cuda, image.as_ptr().cast()) }
    }

    /// # Safety
    /// `image` is a complete image.
    unsafe fn load(cuda: &Cuda, image: *const c_void) -> Result<Library> {
        let mut raw: CUlibrary = std::ptr::null_mut();
        let (jit, jit_values) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (opts, opt_values) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a valid out-pointer and image; no options (null arrays, counts 0).
        unsafe {
            call!(
                cuda,
                cuLibraryLoadData(&mut raw, image, jit, jit_values, 0, opts, opt_values, 0)
            )
        }?;
        Ok(Library {
            code: Code::new(cuda, None, Handle::Library(raw)),
        })
    }

    /// The kernel `name` ([`Error::Lookup`] naming it if the driver has none).
    #[doc(alias = "cuLibraryGetKernel")]
    pub fn kernel(&self, name: &str) -> Result<Kernel<'_>> {
        let c = c_name("Library::kernel", name)?;
        let mut raw: CUkernel = std::ptr::null_mut();
        // SAFETY: a loaded library, a NUL-terminated name and a valid out-pointer.
        unsafe {
            call!(
                self.code.cuda(),
                cuLibraryGetKernel(&mut raw, self.raw(), c.as_ptr())
            )
        }
        .map_err(|e| e.for_symbol(name))?;
        Ok(Kernel {
            code: &self.code,
            raw,
            name: name.to_string(),
        })
    }

    /// The device global `name` in `ctx`, as device memory of `T` (see
    /// [`Module::global`](crate::Module::global)).
    #[doc(alias = "cuLibraryGetGlobal")]
    pub fn global<T: DeviceRepr>(&self, ctx: &Context, name: &str) -> Result<Global<'_, T>> {
        let c = c_name("Library::global", name)?;
        let (mut ptr, mut bytes): (CUdeviceptr, usize) = (0, 0);
        let _g = ctx.bind()?;
        // SAFETY: a loaded library, a NUL-terminated name, valid out-pointers, and the
        // context it is asked for current.
        unsafe {
            call!(
                ctx.cuda(),
                cuLibraryGetGlobal(&mut ptr, &mut bytes, self.raw(), c.as_ptr())
            )
        }
        .map_err(|e| e.for_symbol(name))?;
        Global::new(&self.code, ctx, name, ptr, bytes)
    }

    /// The raw handle (valid while the library lives).
    #[must_use]
    pub fn as_raw(&self) -> CUlibrary {
        self.raw()
    }

    fn raw(&self) -> CUlibrary {
        match self.code.handle() {
            Handle::Library(l) => l,
            _ => std::ptr::null_mut(),
        }
    }
}

/// A kernel of a [`Library`], not yet tied to a context: [`function`](Self::function)
/// gives its [`Function`] in one.
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, Library};
/// let (cuda, _world) = MockDriver::with_devices(2).kernel("noop", &[], |_| {}).build_with(Cuda::from_driver)?;
/// let lib = Library::from_ptx(&cuda, ".version 8.0\n.target sm_90\n.entry noop() { ret; }")?;
/// let noop = lib.kernel("noop")?;
/// assert_eq!(noop.name(), "noop");
/// let on1 = noop.function(&cuda.device(1)?.primary_context()?)?;
/// assert_eq!((on1.name(), on1.context().device().ordinal()), ("noop", 1));
/// assert!(lib.kernel("missing").is_err());
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone)]
pub struct Kernel<'a> {
    code: &'a Code,
    raw: CUkernel,
    name: String,
}

// SAFETY: kernel handles are usable from any thread; the rest is a shared borrow and a name.
unsafe impl Send for Kernel<'_> {}
// SAFETY: as above; nothing is mutated through `&Kernel`.
unsafe impl Sync for Kernel<'_> {}

static_assertions::assert_impl_all!(Kernel<'static>: Send, Sync, Clone, std::fmt::Debug);

impl fmt::Debug for Kernel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).finish()
    }
}

impl<'a> Kernel<'a> {
    /// The kernel's function in `ctx` (loading the library there on first use). It
    /// borrows the library, not this value.
    #[doc(alias = "cuKernelGetFunction")]
    pub fn function(&self, ctx: &Context) -> Result<Function<'a>> {
        let mut raw: CUfunction = std::ptr::null_mut();
        let _g = ctx.bind()?;
        // SAFETY: a kernel of a loaded library, a valid out-pointer and `ctx` current.
        unsafe { call!(ctx.cuda(), cuKernelGetFunction(&mut raw, self.raw)) }?;
        Ok(Function::new(self.code, ctx, raw, &self.name))
    }

    /// The kernel's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw handle (valid while the library lives).
    #[must_use]
    pub fn as_raw(&self) -> CUkernel {
        self.raw
    }
}
