//! The simulated machine's state: devices, contexts, streams, events, memory.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use crate::image::Image;
use crate::kernel::Binding;
use crate::op::Op;
use crate::sanitizer::{Alloc, Clock, Quarantine, Use};
use cuda_sys::{CUresult, CUstreamCaptureMode};

/// One simulated device.
///
/// ```
/// use std::ffi::{CStr, c_char};
/// use cuda_sys::CUresult;
/// use cuda_mock::{MockDevice, MockDriver};
///
/// let gpu = MockDevice::new("Mock H200")
///     .memory(141 << 30)
///     .compute_capability(9, 0)
///     .pci(0, 0x1b, 0)
///     .uuid([7; 16]);
/// let (driver, world) = MockDriver::new().device(gpu).build()?;
/// assert_eq!(world.devices()[0].name, "Mock H200");
/// let f = driver.fns();
/// let (mut bytes, mut bus) = (0usize, [0 as c_char; 32]);
/// // SAFETY: valid out-pointers; the bus id buffer holds the 32 bytes passed.
/// unsafe {
///     assert_eq!((f.cuInit)(0), CUresult::CUDA_SUCCESS);
///     assert_eq!((f.cuDeviceTotalMem)(&mut bytes, 0), CUresult::CUDA_SUCCESS);
///     assert_eq!((f.cuDeviceGetPCIBusId)(bus.as_mut_ptr(), 32, 0), CUresult::CUDA_SUCCESS);
/// }
/// assert_eq!(bytes, 141 << 30);
/// // SAFETY: the driver wrote a NUL-terminated string into the buffer.
/// let bus = unsafe { CStr::from_ptr(bus.as_ptr()) };
/// assert_eq!(bus.to_str(), Ok("00000000:1B:00.0"));
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockDevice {
    /// Name returned by `cuDeviceGetName`.
    pub name: String,
    /// UUID returned by `cuDeviceGetUuid` (`None`: derived from the ordinal).
    pub uuid: Option<[u8; 16]>,
    /// Bytes of device memory; allocations beyond it fail with out-of-memory.
    pub total_memory: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// PCI (domain, bus, device) (`None`: derived from the ordinal).
    pub pci: Option<(u32, u32, u32)>,
    /// Multiprocessor count.
    pub multiprocessors: i32,
}

impl MockDevice {
    /// A device with 16 GiB, compute capability 9.0 and 132 multiprocessors; UUID and PCI
    /// id are derived from its ordinal unless set.
    pub fn new(name: &str) -> Self {
        MockDevice {
            name: name.to_string(),
            uuid: None,
            total_memory: 16 << 30,
            compute_capability: (9, 0),
            pci: None,
            multiprocessors: 132,
        }
    }

    /// Sets the UUID.
    pub fn uuid(mut self, uuid: [u8; 16]) -> Self {
        self.uuid = Some(uuid);
        self
    }

    /// Sets the memory size in bytes.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.total_memory = bytes;
        self
    }

    /// Sets the compute capability.
    pub fn compute_capability(mut self, major: i32, minor: i32) -> Self {
        self.compute_capability = (major, minor);
        self
    }

    /// Sets the PCI domain, bus and device numbers.
    pub fn pci(mut self, domain: u32, bus: u32, device: u32) -> Self {
        self.pci = Some((domain, bus, device));
        self
    }

    pub(crate) fn fill_defaults(mut self, ordinal: usize) -> Self {
        let o = ordinal as u8;
        self.uuid.get_or_insert([
            0x5f, 0xdb, 0x05, 0x6c, 0x53, 0x7e, 0x3b, 0xd5, 0x1c, 0x80, 0xb2, 0x03, 0x94, 0x99,
            0xe8, o,
        ]);
        self.pci.get_or_insert((0, 0x18 + ordinal as u32, 0));
        self
    }

    pub(crate) fn uuid_bytes(&self) -> [u8; 16] {
        self.uuid.unwrap_or_default()
    }

    pub(crate) fn pci_triple(&self) -> (u32, u32, u32) {
        self.pci.unwrap_or_default()
    }
}

/// Counts of live simulated handles; all zero when nothing leaked.
///
/// ```
/// use cuda_mock::{LiveHandles, MockDriver};
/// let (driver, world) = MockDriver::with_devices(1).build()?;
/// let f = driver.fns();
/// let (mut ctx, mut stream) = (std::ptr::null_mut(), std::ptr::null_mut());
/// // SAFETY: valid out-pointers and a current context.
/// unsafe {
///     (f.cuInit)(0);
///     (f.cuDevicePrimaryCtxRetain)(&mut ctx, 0);
///     (f.cuCtxSetCurrent)(ctx);
///     (f.cuStreamCreate)(&mut stream, 0);
/// }
/// let expected = LiveHandles { context_retains: 1, streams: 1, ..LiveHandles::default() };
/// assert_eq!(world.live(), expected);
/// // SAFETY: the stream is destroyed once, then the retain released once.
/// unsafe {
///     (f.cuStreamDestroy)(stream);
///     (f.cuDevicePrimaryCtxRelease)(0);
/// }
/// assert!(world.live().is_empty());
/// # Ok::<(), cuda_sys::LoadError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveHandles {
    /// Primary-context retains not yet released.
    pub context_retains: u32,
    /// Streams created and not destroyed.
    pub streams: usize,
    /// Events created and not destroyed.
    pub events: usize,
    /// Device allocations not freed.
    pub device_allocations: usize,
    /// Pinned host allocations not freed.
    pub host_allocations: usize,
    /// Graphs and executable graphs not destroyed.
    pub graphs: usize,
    /// Modules loaded with `cuModuleLoadData(Ex)` and not unloaded (their globals are
    /// counted here, not in `device_allocations`).
    pub modules: usize,
    /// Libraries loaded with `cuLibraryLoadData` and not unloaded.
    pub libraries: usize,
}

impl LiveHandles {
    /// Nothing alive.
    pub fn is_empty(&self) -> bool {
        *self == LiveHandles::default()
    }
}

pub(crate) struct Fault {
    pub(crate) function: String,
    pub(crate) skip: u64,
    pub(crate) error: CUresult,
}

pub(crate) struct Primary {
    pub(crate) refcount: u32,
    pub(crate) ctx: Option<usize>,
}

pub(crate) struct Ctx {
    pub(crate) device: i32,
}

pub(crate) struct StreamInfo {
    pub(crate) ctx: usize,
    pub(crate) capture: Option<Vec<Op>>,
    pub(crate) capture_invalid: bool,
    /// The running capture's mode and the thread that began it: a capture begun in
    /// global or thread-local mode forbids "unsafe" calls (host synchronisations) to that
    /// thread (global: to every thread), as CUDA does.
    pub(crate) capture_mode: Option<(CUstreamCaptureMode, std::thread::ThreadId)>,
    /// The handle the graph of this stream's running capture gets (0 when none): user
    /// objects can be retained on it while it records.
    pub(crate) capture_graph: usize,
    /// The stream whose capture this one joined by waiting for an event recorded in it:
    /// its work is recorded into that capture until the capture ends.
    pub(crate) joined: Option<usize>,
    /// Created with `CU_STREAM_NON_BLOCKING`: not ordered against the legacy stream.
    pub(crate) non_blocking: bool,
    /// What this stream's next op is ordered after (see the sanitizer).
    pub(crate) clock: Clock,
}

pub(crate) struct EventInfo {
    pub(crate) ctx: usize,
    pub(crate) timing: bool,
    pub(crate) recorded: Option<Instant>,
    /// The recording stream's clock: what a wait on this event is ordered after.
    pub(crate) clock: Clock,
    /// The capture (its origin stream) the event was last recorded in: a stream that
    /// waits for it joins that capture.
    pub(crate) capture: Option<usize>,
}

/// A loaded module.
pub(crate) struct ModuleInfo {
    pub(crate) ctx: usize,
    pub(crate) image: Image,
    /// Global name -> (device address, size in bytes).
    pub(crate) globals: HashMap<String, (usize, usize)>,
    /// Function handles handed out, by name (one handle per name, as the driver does).
    pub(crate) functions: HashMap<String, usize>,
    /// The library this is the per-context module of (not unloadable by itself).
    pub(crate) library: Option<usize>,
    /// Per stream key, the newest launch of one of its functions.
    pub(crate) last_use: HashMap<usize, Use>,
}

/// A function of a loaded module.
pub(crate) struct FuncInfo {
    pub(crate) module: usize,
    pub(crate) ctx: usize,
    pub(crate) name: String,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub(crate) max_dynamic_shared: u32,
}

/// A function whose module is gone: its name and the call that unloaded it.
pub(crate) struct Dead {
    pub(crate) name: String,
    pub(crate) by: &'static str,
}

/// A loaded library.
pub(crate) struct LibraryInfo {
    pub(crate) image: Image,
    /// Its module in each context it was used in.
    pub(crate) modules: HashMap<usize, usize>,
    /// Kernel handles handed out, by name.
    pub(crate) kernels: HashMap<String, usize>,
}

/// A kernel of a loaded library.
pub(crate) struct KernelInfo {
    pub(crate) library: usize,
    pub(crate) name: String,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) faults: Vec<Fault>,
    pub(crate) calls: HashMap<&'static str, u64>,
    pub(crate) primary: HashMap<i32, Primary>,
    pub(crate) contexts: HashMap<usize, Ctx>,
    pub(crate) streams: HashMap<usize, StreamInfo>,
    pub(crate) events: HashMap<usize, EventInfo>,
    pub(crate) allocs: BTreeMap<usize, Alloc>,
    pub(crate) host: HashMap<usize, (usize, std::alloc::Layout)>,
    pub(crate) graphs: HashMap<usize, Vec<Op>>,
    pub(crate) execs: HashMap<usize, Vec<Op>>,
    /// User objects by handle.
    pub(crate) user_objects: HashMap<usize, crate::destructor::UserObj>,
    /// The user-object references each graph, capture's graph or executable graph owns.
    pub(crate) graph_refs: HashMap<usize, Vec<(usize, u64)>>,
    pub(crate) used: Vec<u64>,
    pub(crate) peers: HashSet<(usize, usize)>,
    pub(crate) next_handle: usize,
    pub(crate) order_violations: u64,
    /// Clocks of each context's legacy default stream, by context handle.
    pub(crate) legacy: HashMap<usize, Clock>,
    /// The host's clock: what it has waited for.
    pub(crate) host_clock: Clock,
    /// The newest stamp of every stream key ever used (device-wide syncs join it).
    pub(crate) latest: Clock,
    /// Freed device memory, poisoned and kept so it is not reused and its use is caught.
    pub(crate) freed: Quarantine,
    /// Sanitizer reports, oldest first.
    pub(crate) violations: Vec<String>,
    /// Host-bound kernels by name.
    pub(crate) kernels: HashMap<String, Binding>,
    /// Device globals every module gets, by name, with their size in bytes.
    pub(crate) globals: BTreeMap<String, usize>,
    /// Loaded modules (a library's per-context modules too).
    pub(crate) modules: HashMap<usize, ModuleInfo>,
    /// Functions of loaded modules.
    pub(crate) functions: HashMap<usize, FuncInfo>,
    /// Functions whose module was unloaded: what a later launch of one is reported with.
    pub(crate) dead_functions: HashMap<usize, Dead>,
    /// Loaded libraries.
    pub(crate) libraries: HashMap<usize, LibraryInfo>,
    /// Kernels of loaded libraries.
    pub(crate) library_kernels: HashMap<usize, KernelInfo>,
    /// Function names handed out by `cuFuncGetName`, kept for the world's life.
    pub(crate) names: HashMap<String, std::ffi::CString>,
}

impl State {
    pub(crate) fn live(&self) -> LiveHandles {
        LiveHandles {
            context_retains: self.primary.values().map(|p| p.refcount).sum(),
            streams: self.streams.len(),
            events: self.events.len(),
            device_allocations: self.allocs.values().filter(|a| a.module.is_none()).count(),
            host_allocations: self.host.len(),
            graphs: self.graphs.len() + self.execs.len(),
            modules: self
                .modules
                .values()
                .filter(|m| m.library.is_none())
                .count(),
            libraries: self.libraries.len(),
        }
    }

    /// Records a call of `function` and takes a pending fault for it, if one is due.
    pub(crate) fn enter(&mut self, function: &'static str) -> Option<CUresult> {
        *self.calls.entry(function).or_insert(0) += 1;
        if crate::destructor::in_destructor() {
            self.violation(format!(
                "{function} called from a user object's destructor (CUDA forbids any call there)"
            ));
        }
        let i = self.faults.iter().position(|f| f.function == function)?;
        if self.faults[i].skip > 0 {
            self.faults[i].skip -= 1;
            return None;
        }
        Some(self.faults.remove(i).error)
    }

    /// A fresh handle value, unique in this world and tagged with the world's id.
    pub(crate) fn handle(&mut self, world_id: u64) -> usize {
        self.next_handle += 1;
        ((world_id as usize) << 24) | (self.next_handle << 4)
    }

    /// The live allocation containing `[ptr, ptr + len)`.
    pub(crate) fn find_alloc(&self, ptr: usize, len: usize) -> Option<&Alloc> {
        let (start, a) = self.allocs.range(..=ptr).next_back()?;
        let end = ptr.checked_add(len)?;
        (end <= start + a.len).then_some(a)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        for (_, a) in std::mem::take(&mut self.allocs) {
            if let Some(layout) = Alloc::layout(a.len) {
                // SAFETY: allocated in cuMemAlloc with this layout and not freed since.
                unsafe { std::alloc::dealloc(a.ptr, layout) };
            }
        }
        self.freed.clear();
        for (_, (p, layout)) in std::mem::take(&mut self.host) {
            // SAFETY: allocated in cuMemAllocHost with this layout and not freed since.
            unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        }
    }
}
