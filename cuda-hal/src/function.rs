//! [`Function`]: a kernel in one context, with its attributes, parameter layout and
//! occupancy. Launching is in `launch.rs`.

use std::ffi::c_int;
use std::fmt;
use std::sync::{Arc, OnceLock};

use cuda_sys::{CUfunction, CUfunction_attribute, CUresult};

use crate::code::Code;
use crate::{Context, Error, Result};

/// A kernel of a loaded [`Module`](crate::Module) or [`Library`](crate::Library), in one
/// context. It borrows the code it belongs to, so it cannot outlive it; launches keep the
/// code loaded until they have run (see [`launch`](Self::launch)).
///
/// Its attributes and occupancy, from the driver (here the simulated one's):
///
/// ```
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, Module};
/// let ptx = ".version 8.0\n.target sm_90\n\
///            .visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y) { ret; }\n";
/// let (cuda, _world) = MockDriver::with_devices(1).kernel("saxpy", &[4, 4, 8, 8], |_| {}).build_with(Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let module = Module::from_ptx(&ctx, ptx)?;
/// let saxpy = module.function("saxpy")?;
/// assert_eq!(saxpy.name(), "saxpy");
/// assert_eq!(saxpy.max_threads_per_block()?, 1024);
/// assert_eq!(saxpy.num_registers()?, 32);
/// assert_eq!(saxpy.static_shared_mem_bytes()?, 0);
/// assert_eq!(saxpy.max_dynamic_shared_mem()?, 48 << 10);
/// assert_eq!(saxpy.ptx_version()?, (9, 0));
/// assert_eq!(saxpy.max_active_blocks_per_multiprocessor(256, 0)?, 8);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone)]
pub struct Function<'a> {
    pub(crate) code: &'a Code,
    pub(crate) ctx: Context,
    pub(crate) raw: CUfunction,
    name: Arc<str>,
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`, read once (it never changes).
    max_threads: OnceLock<u32>,
    /// The parameters' sizes, read once; `None` when the driver cannot tell (before 12.4).
    params: OnceLock<Option<Vec<usize>>>,
}

// SAFETY: function handles are usable from any thread (the driver serialises what it
// must); the caches are `OnceLock`s and the rest is shared borrows and clones.
unsafe impl Send for Function<'_> {}
// SAFETY: as above: nothing is mutated through `&Function` except the `OnceLock`s.
unsafe impl Sync for Function<'_> {}

// Deliberate: a function (and a library's kernel) may be shared with and launched from
// any thread; launches serialise on the stream's order lock.
static_assertions::assert_impl_all!(Function<'static>: Send, Sync, Clone, std::fmt::Debug);

impl fmt::Debug for Function<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("device", &self.ctx.device().ordinal())
            .finish()
    }
}

/// Where a kernel parameter lies in the kernel's parameter buffer
/// ([`Function::param_info`], driver ≥ 12.4).
///
/// ```
/// use cuda_hal::ParamInfo;
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, Module};
/// let ptx = ".version 8.0\n.target sm_90\n\
///            .visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y) { ret; }\n";
/// let (cuda, _world) = MockDriver::with_devices(1).kernel("saxpy", &[4, 4, 8, 8], |_| {}).build_with(Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let module = Module::from_ptx(&ctx, ptx)?;
/// let saxpy = module.function("saxpy")?;
/// let sizes: Vec<usize> = saxpy.param_info()?.iter().map(|p: &ParamInfo| p.size).collect();
/// assert_eq!(sizes, [4, 4, 8, 8]);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParamInfo {
    /// Offset in bytes.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// The block size that gives a kernel the most resident threads, with the smallest grid
/// that fills the device at that size ([`Function::max_potential_block_size`]).
///
/// ```
/// use cuda_hal::BlockSize;
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, Module};
/// let ptx = ".version 8.0\n.target sm_90\n\
///            .visible .entry saxpy(.param .u32 n, .param .f32 a, .param .u64 x, .param .u64 y) { ret; }\n";
/// let (cuda, _world) = MockDriver::with_devices(1).kernel("saxpy", &[4, 4, 8, 8], |_| {}).build_with(Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// let module = Module::from_ptx(&ctx, ptx)?;
/// let saxpy = module.function("saxpy")?;
/// // The simulated device has 132 multiprocessors, each holding 2048 threads.
/// let best = saxpy.max_potential_block_size(0, 0)?;
/// assert_eq!(best, BlockSize { min_grid_size: 2 * 132, block_size: 1024 });
/// let capped = saxpy.max_potential_block_size(0, 256)?;
/// assert_eq!(capped, BlockSize { min_grid_size: 8 * 132, block_size: 256 });
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockSize {
    /// Blocks needed to fill every multiprocessor.
    pub min_grid_size: u32,
    /// Threads per block.
    pub block_size: u32,
}

/// A driver version number such as 90 as (major, minor).
fn version(v: i32) -> (u32, u32) {
    let v = u32::try_from(v).unwrap_or(0);
    (v / 10, v % 10)
}

/// Kernel parameters are at most 32764 bytes (CUDA 12.1), so at most that many: a bound
/// on the walk over `cuFuncGetParamInfo` should a driver never say "no more".
const MAX_PARAMS: usize = 32764;

impl<'a> Function<'a> {
    pub(crate) fn new(code: &'a Code, ctx: &Context, raw: CUfunction, name: &str) -> Self {
        Function {
            code,
            ctx: ctx.clone(),
            raw,
            name: name.into(),
            max_threads: OnceLock::new(),
            params: OnceLock::new(),
        }
    }

    /// The kernel's name, as it was asked for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The context the function belongs to (launches go on its streams).
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw handle (valid while the code it belongs to lives).
    pub fn as_raw(&self) -> CUfunction {
        self.raw
    }

    /// An attribute's value.
    #[doc(alias = "cuFuncGetAttribute")]
    pub fn attribute(&self, attribute: CUfunction_attribute) -> Result<i32> {
        let mut v: c_int = 0;
        let _g = self.ctx.bind()?;
        // SAFETY: a live function (its code is borrowed) and a valid out-pointer.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuFuncGetAttribute(&mut v, attribute, self.raw)
            )
        }?;
        Ok(v)
    }

    /// The most threads a block of this kernel can have (its registers and the device
    /// decide).
    #[doc(alias = "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK")]
    pub fn max_threads_per_block(&self) -> Result<u32> {
        if let Some(v) = self.max_threads.get() {
            return Ok(*v);
        }
        let v = self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
        let v = u32::try_from(v).unwrap_or(0);
        Ok(*self.max_threads.get_or_init(|| v))
    }

    /// Registers each thread uses.
    #[doc(alias = "CU_FUNC_ATTRIBUTE_NUM_REGS")]
    pub fn num_registers(&self) -> Result<u32> {
        let v = self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// Statically allocated shared memory per block, in bytes.
    #[doc(alias = "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")]
    pub fn static_shared_mem_bytes(&self) -> Result<usize> {
        let v = self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
        Ok(usize::try_from(v).unwrap_or(0))
    }

    /// The most dynamic shared memory a launch may ask for, in bytes (48 KiB unless raised
    /// with [`set_max_dynamic_shared_mem`](Self::set_max_dynamic_shared_mem)).
    #[doc(alias = "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")]
    pub fn max_dynamic_shared_mem(&self) -> Result<u32> {
        let v =
            self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// Lets launches ask for up to `bytes` of dynamic shared memory (beyond 48 KiB, up to
    /// the device's opt-in limit).
    #[doc(alias = "cuFuncSetAttribute")]
    pub fn set_max_dynamic_shared_mem(&self, bytes: u32) -> Result<()> {
        let v = c_int::try_from(bytes).map_err(|_| Error::InvalidArgument {
            what: "Function::set_max_dynamic_shared_mem",
            problem: format!("{bytes} bytes is more than the driver can be asked for"),
        })?;
        let _g = self.ctx.bind()?;
        // SAFETY: a live function; the attribute takes a byte count.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuFuncSetAttribute(
                    self.raw,
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    v
                )
            )
        }
    }

    /// The PTX virtual architecture it was compiled for, as (major, minor).
    #[doc(alias = "CU_FUNC_ATTRIBUTE_PTX_VERSION")]
    pub fn ptx_version(&self) -> Result<(u32, u32)> {
        self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PTX_VERSION)
            .map(version)
    }

    /// The architecture of its binary code, as (major, minor).
    #[doc(alias = "CU_FUNC_ATTRIBUTE_BINARY_VERSION")]
    pub fn binary_version(&self) -> Result<(u32, u32)> {
        self.attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_BINARY_VERSION)
            .map(version)
    }

    /// Offset and size of each parameter (driver ≥ 12.4, else [`Error::Unsupported`]).
    #[doc(alias = "cuFuncGetParamInfo")]
    pub fn param_info(&self) -> Result<Vec<ParamInfo>> {
        let cuda = self.ctx.cuda();
        let f = cuda.require(cuda.fns().cuFuncGetParamInfo, "cuFuncGetParamInfo")?;
        let _g = self.ctx.bind()?;
        let mut out = Vec::new();
        for i in 0..MAX_PARAMS {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a live function and valid out-pointers.
            let rc = unsafe { f(self.raw, i, &mut offset, &mut size) };
            match rc {
                CUresult::CUDA_SUCCESS => out.push(ParamInfo { offset, size }),
                // The index past the last parameter.
                CUresult::CUDA_ERROR_INVALID_VALUE => break,
                e => return Err(cuda.error(e, "cuFuncGetParamInfo")),
            }
        }
        Ok(out)
    }

    /// The parameters' sizes, read once; `None` when the driver cannot tell.
    pub(crate) fn param_sizes(&self) -> Result<Option<&[usize]>> {
        if let Some(p) = self.params.get() {
            return Ok(p.as_deref());
        }
        let sizes = match self.param_info() {
            Ok(info) => Some(info.iter().map(|p| p.size).collect()),
            Err(Error::Unsupported { .. }) => None,
            Err(e) => return Err(e),
        };
        Ok(self.params.get_or_init(|| sizes).as_deref())
    }

    /// How many blocks of `block_size` threads, each with `dynamic_shared_mem` bytes of
    /// dynamic shared memory, fit on one multiprocessor at once.
    #[doc(alias = "cuOccupancyMaxActiveBlocksPerMultiprocessor")]
    pub fn max_active_blocks_per_multiprocessor(
        &self,
        block_size: u32,
        dynamic_shared_mem: usize,
    ) -> Result<u32> {
        let block = c_int::try_from(block_size).map_err(|_| Error::InvalidArgument {
            what: "Function::max_active_blocks_per_multiprocessor",
            problem: format!("{block_size} threads per block is out of range"),
        })?;
        let mut n: c_int = 0;
        let _g = self.ctx.bind()?;
        // SAFETY: a live function and a valid out-pointer; the context is current.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    &mut n,
                    self.raw,
                    block,
                    dynamic_shared_mem
                )
            )
        }?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// The block size that gives the most resident threads, with `dynamic_shared_mem`
    /// bytes of dynamic shared memory per block and at most `block_size_limit` threads
    /// (0: no limit beyond the kernel's).
    #[doc(alias = "cuOccupancyMaxPotentialBlockSize")]
    pub fn max_potential_block_size(
        &self,
        dynamic_shared_mem: usize,
        block_size_limit: u32,
    ) -> Result<BlockSize> {
        let limit = c_int::try_from(block_size_limit).unwrap_or(c_int::MAX);
        let (mut grid, mut block): (c_int, c_int) = (0, 0);
        let _g = self.ctx.bind()?;
        // SAFETY: a live function and valid out-pointers; no callback (null), so the
        // driver uses `dynamic_shared_mem` for every block size.
        unsafe {
            call!(
                self.ctx.cuda(),
                cuOccupancyMaxPotentialBlockSize(
                    &mut grid,
                    &mut block,
                    self.raw,
                    None,
                    dynamic_shared_mem,
                    limit
                )
            )
        }?;
        Ok(BlockSize {
            min_grid_size: u32::try_from(grid).unwrap_or(0),
            block_size: u32::try_from(block).unwrap_or(0),
        })
    }
}
