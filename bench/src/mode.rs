//! The memory modes of `-R`: which memory the buffers live in, to measure what NCCL's
//! allocator, registration and symmetric windows change.

/// Where a rank's send and receive memory comes from (`-R`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mem {
    /// `DeviceBuffer::zeroed` (cuMemAlloc).
    Plain,
    /// `Communicator::alloc_nccl`, not registered: what the allocator alone changes.
    Unregistered,
    /// `Communicator::alloc_nccl` + `Communicator::register`.
    Registered,
    /// `Communicator::alloc_nccl` + `Communicator::register_window` (COLL_SYMMETRIC).
    Window,
    /// `Communicator::buffer`.
    Pool,
    /// `Communicator::symmetric`: every rank allocates at once, registered as a symmetric
    /// window (the collective allocation; the default).
    Symmetric,
}

impl Mem {
    /// The name `-R` takes and the tables print.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mem::Plain => "0",
            Mem::Unregistered => "nccl",
            Mem::Registered => "1",
            Mem::Window => "2",
            Mem::Pool => "pool",
            Mem::Symmetric => "sym",
        }
    }

    /// What the mode allocates, for the header.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Mem::Plain => "cuMemAlloc",
            Mem::Unregistered => "ncclMemAlloc, unregistered",
            Mem::Registered => "ncclMemAlloc + ncclCommRegister",
            Mem::Window => "ncclMemAlloc + ncclCommWindowRegister(COLL_SYMMETRIC)",
            Mem::Pool => "the communicator's pool, registered by the collectives that gain",
            Mem::Symmetric => {
                "Communicator::symmetric: ncclMemAlloc + a symmetric window, every rank at once"
            }
        }
    }
}

/// One mode of `-R`.
pub(crate) fn mem_arg(s: &str) -> Result<Mem, String> {
    match s {
        "0" => Ok(Mem::Plain),
        "nccl" => Ok(Mem::Unregistered),
        "1" => Ok(Mem::Registered),
        "2" => Ok(Mem::Window),
        "pool" => Ok(Mem::Pool),
        "sym" => Ok(Mem::Symmetric),
        _ => Err("0, nccl, 1, 2, pool or sym".into()),
    }
}
