//! The error type: driver failures keep the `CUresult`, its name and the driver's message.

use cuda_sys::{CUresult, LoadError};

use crate::LaunchConfig;

/// Everything that can go wrong in `cuda-hal`.
///
/// Driver failures keep the driver's status, name and message; the crate's own checks,
/// made before anything reaches the driver, have variants of their own:
///
/// ```
/// use cuda_hal::cuda_sys::CUresult;
/// use cuda_mock::MockDriver;
/// use cuda_hal::{Cuda, DeviceBuffer, Error};
///
/// let (cuda, world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
/// let ctx = cuda.device(0)?.primary_context()?;
/// world.fail_next("cuMemAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY);
/// let Err(Error::Driver { call, code, name, .. }) = DeviceBuffer::<f32>::alloc(&ctx, 1024) else {
///     panic!("the simulated driver was told to fail");
/// };
/// assert_eq!((call, code, name.as_str()), ("cuMemAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"));
///
/// let buf = DeviceBuffer::<f32>::zeroed(&ctx, 4)?;
/// let e = buf.slice(2..6).unwrap_err();
/// assert_eq!(e, Error::OutOfRange { what: "DeviceView::slice", start: 2, end: 6, len: 4 });
/// assert_eq!(e.to_string(), "DeviceView::slice: the range 2..6 does not fit in 4 elements");
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A driver call failed.
    #[error("{call} failed: {name} ({}): {message}", code.0)]
    Driver {
        /// The driver function that failed (`"cuMemAlloc"`).
        call: &'static str,
        /// The raw status.
        code: CUresult,
        /// `cuGetErrorName` of the status (`"CUDA_ERROR_OUT_OF_MEMORY"`).
        name: String,
        /// `cuGetErrorString` of the status.
        message: String,
    },
    /// A kernel or global looked up by name was not given: the driver's status for the
    /// lookup, with the name asked for (a typo shows here, where
    /// [`Error::Driver`] would only say `CUDA_ERROR_NOT_FOUND`).
    ///
    /// ```
    /// use cuda_hal::cuda_sys::CUresult;
    /// use cuda_hal::{Cuda, Error, Module};
    /// use cuda_mock::MockDriver;
    ///
    /// let (cuda, _world) = MockDriver::with_devices(1).kernel("saxpy", &[], |_| {}).build_with(Cuda::from_driver)?;
    /// let ctx = cuda.device(0)?.primary_context()?;
    /// let module = Module::from_ptx(&ctx, ".version 8.0\n.target sm_90\n.entry saxpy() { ret; }")?;
    /// let e = module.function("saxpi").unwrap_err();
    /// let Error::Lookup { call, symbol, code, .. } = &e else { panic!("{e}") };
    /// assert_eq!((*call, symbol.as_str(), *code), ("cuModuleGetFunction", "saxpi", CUresult::CUDA_ERROR_NOT_FOUND));
    /// assert!(e.to_string().starts_with("cuModuleGetFunction(\"saxpi\") failed: CUDA_ERROR_NOT_FOUND (500): "));
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[error("{call}({symbol:?}) failed: {name} ({}): {message}", code.0)]
    Lookup {
        /// The driver function that failed (`"cuModuleGetFunction"`).
        call: &'static str,
        /// The kernel's or global's name, as asked for.
        symbol: String,
        /// The raw status.
        code: CUresult,
        /// `cuGetErrorName` of the status (`"CUDA_ERROR_NOT_FOUND"`).
        name: String,
        /// `cuGetErrorString` of the status.
        message: String,
    },
    /// The driver library could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A device selector string is malformed.
    #[error(
        "invalid device selector {input:?}: {problem}; expected `cuda://` (default device), \
         `cuda://<ordinal>`, `cuda://GPU-<uuid>`, `cuda://MIG-<uuid>` or \
         `cuda://<pci bus id>` (e.g. `cuda://0000:18:00.0`)"
    )]
    InvalidSelector {
        /// The selector as given.
        input: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A UUID string is malformed.
    #[error(
        "invalid GPU UUID {input:?}: {problem}; expected 32 hex digits as \
         `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (as `nvidia-smi -L` prints it)"
    )]
    InvalidUuid {
        /// The UUID as given.
        input: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A PCI bus id string is malformed.
    #[error(
        "invalid PCI bus id {input:?}: expected `[domain:]bus:device.function` in hex, e.g. `0000:18:00.0`"
    )]
    InvalidPciBusId {
        /// The id as given.
        input: String,
    },
    /// A selector is well formed but no device matches it.
    #[error(
        "no CUDA device matches {selector}; the devices are:{}",
        list(available)
    )]
    NoSuchDevice {
        /// The selector, as text.
        selector: String,
        /// One line per existing device.
        available: Vec<String>,
    },
    /// The loaded driver is too old for a function.
    #[error("{feature} needs a CUDA {needed} driver; the loaded driver is CUDA {found}")]
    Unsupported {
        /// What is missing: the driver function (`"cuStreamGetDevice"`).
        feature: &'static str,
        /// The first CUDA version that has it.
        needed: String,
        /// The loaded driver's version.
        found: String,
    },
    /// A buffer has the wrong number of elements.
    #[error(
        "{what}: the {buffer} buffer must hold {expected} element{}, it holds {got}",
        if *expected == 1 { "" } else { "s" }
    )]
    LengthMismatch {
        /// The operation.
        what: &'static str,
        /// Which buffer: `"host"` (a host slice) or `"source"` (a device copy's source).
        buffer: &'static str,
        /// The length needed (that of the memory written or read).
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// An object passed belongs to another device than the one the operation needs.
    #[error("{what}: the {object} is on device {found}, expected device {expected}")]
    WrongDevice {
        /// The operation.
        what: &'static str,
        /// `"stream"`, `"kernel argument"`, ...
        object: &'static str,
        /// The device ordinal the operation needs.
        expected: i32,
        /// The device ordinal of the object passed.
        found: i32,
    },
    /// An object passed is on the right device but in another context: it comes from
    /// another [`Cuda`](crate::Cuda) instance (a driver loaded again, or another
    /// simulated machine).
    #[error(
        "{what}: the {object} belongs to another CUDA context (both are on device {device}; \
         another Cuda instance?): use objects of one context"
    )]
    WrongContext {
        /// The operation.
        what: &'static str,
        /// `"stream"`, `"kernel argument"`, ...
        object: &'static str,
        /// The device ordinal both are on.
        device: i32,
    },
    /// A call that waits for its stream was made while a capture records that stream.
    #[error(
        "{what} waits for its stream, which is being captured into a graph; end the capture \
         first (or use the unsafe `*_async` form)"
    )]
    Capturing {
        /// The operation.
        what: &'static str,
    },
    /// Memory whose home stream (stream-ordered allocation, adopted memory) still has work
    /// pending is first used inside a capture that forbids the host wait ordering it.
    #[error(
        "{what}: its home stream may still have work pending on it, and the capture \
         (global or thread-local mode) forbids this thread the host wait that would order \
         the captured work after it; use the memory once before the capture, or capture in \
         CaptureMode::Relaxed"
    )]
    PendingInCapture {
        /// The operation.
        what: &'static str,
    },
    /// Captured work depends on something that is no longer usable.
    #[error("the graph cannot be launched: {what}")]
    Unusable {
        /// What is gone, and why (e.g. a communicator that was aborted).
        what: String,
    },
    /// A capture was not begun through this crate, so nothing it recorded is kept alive.
    #[error(
        "{what}: the stream's capture was not begun with Stream::begin_capture, so this \
         crate cannot keep the captured work's memory alive"
    )]
    ForeignCapture {
        /// The operation.
        what: &'static str,
    },
    /// The context is not one this crate can hold from its handle alone (another crate's
    /// non-primary context): adopt it with [`Context::from_raw`](crate::Context::from_raw).
    #[error(
        "{what}: the current context on device {device} is not its primary context; a \
         non-primary context is held by whoever made it: adopt it with Context::from_raw \
         and that owner"
    )]
    ForeignContext {
        /// The operation.
        what: &'static str,
        /// The device the context is on.
        device: i32,
    },
    /// Another crate's CUDA object belongs to a driver this [`Cuda`](crate::Cuda) does not
    /// drive (the two crates loaded different driver libraries, or one of them is an
    /// in-process simulated driver).
    #[error(
        "{what}: the object belongs to another driver than this Cuda's (both crates must \
         load the same libcuda; an in-process simulated driver cannot be shared: use the \
         drop-in simulated libcuda instead)"
    )]
    ForeignDriver {
        /// The operation.
        what: &'static str,
    },
    /// Work enqueued now could run after the borrow of memory it uses has ended: the
    /// memory is borrowed from another crate (that cannot be held), and the stream is
    /// captured or an NCCL group is open.
    #[error(
        "{what}: borrowed memory cannot be used while {why}: the work would run after the \
         borrow ends; adopt the memory instead (DeviceBuffer::from_owner, or with the \
         `cudarc` feature DeviceBuffer::from_cudarc)"
    )]
    Deferred {
        /// The operation.
        what: &'static str,
        /// What defers the work: a capture, or an open group.
        why: &'static str,
    },
    /// A range does not fit the memory it was taken of.
    #[error("{what}: the range {start}..{end} does not fit in {len} elements")]
    OutOfRange {
        /// The operation.
        what: &'static str,
        /// The range's first element (`usize::MAX` if it overflowed).
        start: usize,
        /// One past the range's last element (`usize::MAX` if it overflowed).
        end: usize,
        /// The number of elements there are.
        len: usize,
    },
    /// An argument is out of its domain.
    #[error("{what}: {problem}")]
    InvalidArgument {
        /// The operation.
        what: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A kernel was given another number of arguments than it has parameters.
    #[error("kernel {kernel} takes {expected} parameters; {got} arguments were given")]
    KernelArgumentCount {
        /// The kernel's name.
        kernel: String,
        /// Its parameter count (`cuFuncGetParamInfo`).
        expected: usize,
        /// The number of arguments given.
        got: usize,
    },
    /// An argument's size differs from its parameter's.
    #[error("kernel {kernel}: parameter {index} is {expected} bytes; the argument given is {got}")]
    KernelArgumentSize {
        /// The kernel's name.
        kernel: String,
        /// The parameter's position (from 0).
        index: usize,
        /// The parameter's size in bytes (`cuFuncGetParamInfo`).
        expected: usize,
        /// The argument's size in bytes.
        got: usize,
    },
    /// A launch shape the kernel cannot run with.
    #[error(
        "kernel {kernel} cannot be launched with grid {:?} and block {:?}: {problem}",
        config.grid,
        config.block
    )]
    InvalidLaunchConfig {
        /// The kernel's name.
        kernel: String,
        /// The configuration given.
        config: LaunchConfig,
        /// What is wrong with it.
        problem: String,
    },
    /// `cuEventElapsedTime` gave no duration: a negative time (the end event completed
    /// before the start event), or one that is not finite or beyond `u64` nanoseconds.
    #[error(
        "cuEventElapsedTime gave {ms} ms, which is no duration: the end event completed before \
         the start event, or the time is not finite or too large"
    )]
    InvalidElapsed {
        /// The driver's value, in milliseconds.
        ms: f32,
    },
    /// A size in bytes does not fit in `usize`.
    #[error("size overflow: {count} elements of {size} bytes each")]
    SizeOverflow {
        /// Element count.
        count: usize,
        /// Element size.
        size: usize,
    },
}

impl Error {
    /// A failed lookup of `symbol` by name: a driver failure becomes [`Error::Lookup`],
    /// anything else is kept.
    pub(crate) fn for_symbol(self, symbol: &str) -> Error {
        match self {
            Error::Driver {
                call,
                code,
                name,
                message,
            } => Error::Lookup {
                call,
                symbol: symbol.to_string(),
                code,
                name,
                message,
            },
            other => other,
        }
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        return " (none)".into();
    }
    items.iter().map(|i| format!("\n  {i}")).collect()
}

/// `Result` with [`Error`].
///
/// ```
/// use cuda_hal::{Cuda, Result};
/// fn devices(cuda: &Cuda) -> Result<usize> {
///     cuda.device_count()
/// }
/// let (cuda, _world) = cuda_mock::MockDriver::with_devices(3).build_with(Cuda::from_driver)?;
/// assert_eq!(devices(&cuda)?, 3);
/// # Ok::<(), cuda_hal::Error>(())
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;

    /// One element: no plural.
    #[test]
    fn a_length_of_one_reads_in_the_singular() {
        let e = |expected| Error::LengthMismatch {
            what: "DeviceBuffer::copy_from_host",
            buffer: "host",
            expected,
            got: 3,
        };
        assert_eq!(
            e(1).to_string(),
            "DeviceBuffer::copy_from_host: the host buffer must hold 1 element, it holds 3"
        );
        assert_eq!(
            e(2).to_string(),
            "DeviceBuffer::copy_from_host: the host buffer must hold 2 elements, it holds 3"
        );
    }
}
