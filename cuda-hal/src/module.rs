//! [`Module`]: device code loaded into one context, its [`Function`]s and its device
//! globals ([`Global`]).

use std::ffi::{CStr, CString, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;

use cuda_sys::{CUdeviceptr, CUfunction, CUmodule};

use crate::code::{Code, Handle};
use crate::{
    Context, DeviceRepr, DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut, Error, Function,
    Result, Stream,
};

/// A module: PTX, a cubin or a fatbin loaded into one [`Context`].
///
/// Its [`Function`]s and [`Global`]s borrow it, so it outlives them; work that launched
/// its kernels (also captured into a graph) keeps the code itself loaded: dropping the
/// `Module` unloads it only once no launch can still run it (see the crate's Safety
/// section), and never while a graph that launches it lives.
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, DeviceBuffer, LaunchConfig, Module, Stream};
/// // Without a GPU: the simulated driver runs `scale` as a Rust function.
/// let (cuda, _world) = MockDriver::with_devices(1).kernel("scale", &[8, 8, 4], |k| {
///     let (p, n, by) = (k.param::<u64>(0), k.param::<u64>(1), k.param::<f32>(2));
///     let v: Vec<f32> = k.read::<f32>(p, n as usize).iter().map(|x| x * by).collect();
///     k.write(p, &v);
/// }).build_with(Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\
///            .visible .entry scale(.param .u64 p, .param .u64 n, .param .f32 by) { ret; }\n";
/// let module = Module::from_ptx(&ctx, ptx)?;
/// let scale = module.function("scale")?;
/// let stream = Stream::new(&ctx)?;
/// let mut data = DeviceBuffer::from_slice(&ctx, &[1.0f32, 2.0, 3.0])?;
/// let n = data.len() as u64;
/// // SAFETY: `scale` reads and writes `n` floats at its first argument.
/// unsafe { scale.launch(&stream, LaunchConfig::for_elements(3, 128), (&mut data, n, 10.0f32)) }?;
/// stream.synchronize()?;
/// assert_eq!(data.to_vec()?, [10.0, 20.0, 30.0]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct Module {
    code: Code,
    ctx: Context,
}

static_assertions::assert_impl_all!(Module: Send, Sync, std::fmt::Debug);

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.ctx.device().ordinal())
            .finish()
    }
}

/// `name` as a C string, or [`Error::InvalidArgument`] naming `what`.
pub(crate) fn c_name(what: &'static str, name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::InvalidArgument {
        what,
        problem: format!("the name {name:?} contains a NUL byte"),
    })
}

impl Module {
    /// Loads PTX text (JIT-compiled by the driver for the context's device).
    #[doc(alias = "cuModuleLoadData")]
    pub fn from_ptx(ctx: &Context, ptx: &str) -> Result<Module> {
        let text = CString::new(ptx).map_err(|_| Error::InvalidArgument {
            what: "Module::from_ptx",
            problem: "PTX text must not contain a NUL byte".into(),
        })?;
        Self::from_ptx_cstr(ctx, &text)
    }

    /// Loads NUL-terminated PTX text.
    #[doc(alias = "cuModuleLoadData")]
    pub fn from_ptx_cstr(ctx: &Context, ptx: &CStr) -> Result<Module> {
        // SAFETY: a NUL-terminated string is a complete image: the driver reads PTX up to
        // its terminator.
        unsafe { Self::load(ctx, ptx.as_ptr().cast()) }
    }

    /// Loads a cubin or a fatbin.
    ///
    /// # Safety
    /// `image` is one complete cubin (ELF) or fatbin image: the driver takes no length
    /// and reads as far as the image's own headers say, so headers that claim more than
    /// `image` holds would make it read past the slice.
    #[doc(alias = "cuModuleLoadData")]
    pub unsafe fn from_binary(ctx: &Context, image: &[u8]) -> Result<Module> {
        // SAFETY: the caller's contract.
        unsafe { Self::load(ctx, image.as_ptr().cast()) }
    }

    /// # Safety
    /// `image` is a complete image (see [`from_binary`](Self::from_binary)).
    unsafe fn load(ctx: &Context, image: *const c_void) -> Result<Module> {
        let _g = ctx.bind()?;
        let mut raw: CUmodule = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, a complete image (the caller's contract) and a
        // current context.
        unsafe { call!(ctx.cuda(), cuModuleLoadData(&mut raw, image)) }?;
        Ok(Module {
            code: Code::new(ctx.cuda(), Some(ctx), Handle::Module(raw)),
            ctx: ctx.clone(),
        })
    }

    /// The kernel `name` ([`Error::Lookup`] naming it if the driver has none). The
    /// function borrows the module.
    #[doc(alias = "cuModuleGetFunction")]
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        let c = c_name("Module::function", name)?;
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module, a NUL-terminated name and a valid out-pointer.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuModuleGetFunction(&mut raw, self.raw(), c.as_ptr())
            )
        }
        .map_err(|e| e.for_symbol(name))?;
        Ok(Function::new(&self.code, &self.ctx, raw, name))
    }

    /// The device global `name` as device memory of `T`: its size must be a whole number
    /// of `T`s ([`Error::InvalidArgument`] otherwise). Work that uses it keeps the module
    /// loaded.
    #[doc(alias = "cuModuleGetGlobal")]
    pub fn global<T: DeviceRepr>(&self, name: &str) -> Result<Global<'_, T>> {
        let c = c_name("Module::global", name)?;
        let (mut ptr, mut bytes): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: a loaded module, a NUL-terminated name and valid out-pointers.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuModuleGetGlobal(&mut ptr, &mut bytes, self.raw(), c.as_ptr())
            )
        }
        .map_err(|e| e.for_symbol(name))?;
        Global::new(&self.code, &self.ctx, name, ptr, bytes)
    }

    /// The context the module is loaded in.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw handle (valid while the module lives).
    #[must_use]
    pub fn as_raw(&self) -> CUmodule {
        self.raw()
    }

    fn raw(&self) -> CUmodule {
        match self.code.handle() {
            Handle::Module(m) => m,
            _ => std::ptr::null_mut(),
        }
    }
}

/// A device global of a [`Module`] (or of a [`Library`](crate::Library) in one context):
/// `len` elements of `T` of device memory that belongs to the code, and is used like any
/// other device memory ([`DeviceSlice`], [`DeviceSliceMut`], views).
///
/// Every `global` call gives a new value for the same memory, which the code's kernels may
/// write too: `&mut` of a `Global` orders this crate's calls on it, it is not the only
/// writer (as for any memory a kernel is given). Contents races are never undefined
/// behaviour here ([`DeviceRepr`]); the memory's life is what is guarded: work that uses
/// a global keeps its code loaded.
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, DeviceBuffer, Module};
/// // The simulated driver gives every module a 16-byte global `table`.
/// let (cuda, _world) = MockDriver::with_devices(1).global("table", 16).build_with(Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let module = Module::from_ptx(&ctx, ".version 8.0\n.target sm_90\n.global .u32 table[4];\n")?;
/// let mut table = module.global::<u32>("table")?;
/// assert_eq!(table.len(), 4);
/// table.copy_from_host(&[1, 2, 3, 4])?;
/// // Device memory like any other: views, copies, kernel arguments.
/// let mut out = DeviceBuffer::<u32>::zeroed(&ctx, 2)?;
/// out.copy_from(&table.as_view().slice(2..)?)?;
/// assert_eq!(out.to_vec()?, [3, 4]);
/// assert_eq!(module.global::<u64>("table")?.len(), 2);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub struct Global<'a, T: DeviceRepr> {
    code: &'a Code,
    ctx: Context,
    ptr: CUdeviceptr,
    len: usize,
    _t: PhantomData<T>,
}

static_assertions::assert_impl_all!(Global<'static, f32>: Send, Sync, std::fmt::Debug);
static_assertions::assert_not_impl_any!(Global<'static, f32>: Clone);

impl<T: DeviceRepr> fmt::Debug for Global<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Global")
            .field("device", &self.ctx.device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl<'a, T: DeviceRepr> Global<'a, T> {
    pub(crate) fn new(
        code: &'a Code,
        ctx: &Context,
        name: &str,
        ptr: CUdeviceptr,
        bytes: usize,
    ) -> Result<Self> {
        if size_of::<T>() == 0 || !bytes.is_multiple_of(size_of::<T>()) {
            return Err(Error::InvalidArgument {
                what: "global",
                problem: format!(
                    "the global {name} is {bytes} bytes, not a whole number of {}-byte elements",
                    size_of::<T>()
                ),
            });
        }
        Ok(Global {
            code,
            ctx: ctx.clone(),
            ptr,
            len: bytes / size_of::<T>(),
            _t: PhantomData,
        })
    }

    /// Number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address.
    #[must_use]
    pub fn as_raw(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The context the memory belongs to.
    #[must_use]
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// A view of all of it.
    #[must_use]
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView::new(self)
    }

    /// An exclusive view of all of it.
    pub fn as_view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut::new(self)
    }

    /// Downloads it into a new `Vec`.
    #[doc(alias = "cuMemcpyDtoH")]
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_view().to_vec()
    }

    /// Uploads `src` (same length).
    #[doc(alias = "cuMemcpyHtoD")]
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.as_view_mut().copy_from_host(src)
    }
}

// SAFETY: the driver reports `len * size_of::<T>()` bytes of device memory at `ptr`,
// allocated in `ctx` for as long as the code is loaded; the borrow keeps the code's owner
// alive for 'a, and `used_on` notes the stream on the code and hands a shared owner of it
// to an open capture or group, so the code (and with it the global) is unloaded only
// after that work (see `Code`).
unsafe impl<T: DeviceRepr> DeviceSlice for Global<'_, T> {
    type Elem = T;
    fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn context(&self) -> &Context {
        &self.ctx
    }
    fn used_on(&self, stream: &Stream) -> Result<()> {
        self.code.used_on(stream)
    }
    fn keep_alive(&self) -> Option<crate::KeepAlive> {
        Some(self.code.keep_alive())
    }
}

// SAFETY: module globals are writable device memory (`__device__` variables; constant
// memory is written through the same address by copies).
unsafe impl<T: DeviceRepr> DeviceSliceMut for Global<'_, T> {}
