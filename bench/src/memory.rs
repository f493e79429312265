//! A rank's memory in each mode of `-R`: allocated (and registered) once for the largest
//! size, outside the timing; every size uses leading slices of it.

use cuda_hal::{DeviceBuffer, DeviceViewMut};
use nccl_channel::{
    Communicator, PooledBuffer, Registration, Result, SymmetricBuffer, Window, WindowFlags,
};

use crate::element::BenchVal;
use crate::mode::Mem;

/// A rank's buffers for one (collective, size, mode): leading slices of the mode's memory.
pub(crate) struct Bufs<'a, T: BenchVal> {
    pub(crate) send: DeviceViewMut<'a, T>,
    pub(crate) recv: DeviceViewMut<'a, T>,
}

/// A rank's send or receive memory in one mode, allocated (and registered) once, for the
/// largest size. A registration is a field before its memory, so it is dropped first.
pub(crate) enum Memory<'c, T: BenchVal> {
    Plain(DeviceBuffer<T>),
    Registered {
        _reg: Registration<'c>,
        buf: DeviceBuffer<T>,
    },
    Window {
        win: Window<'c>,
        buf: DeviceBuffer<T>,
    },
    Pool(PooledBuffer<'c, T>),
    Symmetric(SymmetricBuffer<'c, T>),
}

/// A mode that runs: its name, its send memory and its receive memory.
pub(crate) type ModeMemory<'c, T> = (Mem, Memory<'c, T>, Memory<'c, T>);

impl<'c, T: BenchVal> Memory<'c, T> {
    /// Collective for windows: every rank calls it for the same modes in the same order.
    pub(crate) fn alloc(comm: &'c Communicator, mem: Mem, len: usize) -> Result<Self> {
        let zero = T::from_f(0.0);
        Ok(match mem {
            Mem::Plain => Memory::Plain(DeviceBuffer::zeroed(comm.context(), len)?),
            Mem::Unregistered => {
                let mut b = comm.alloc_nccl::<T>(len)?;
                b.fill(zero)?;
                Memory::Plain(b)
            }
            Mem::Registered => {
                let mut b = comm.alloc_nccl::<T>(len)?;
                b.fill(zero)?;
                Memory::Registered {
                    _reg: comm.register(&b)?,
                    buf: b,
                }
            }
            Mem::Window => {
                let mut b = comm.alloc_nccl::<T>(len)?;
                b.fill(zero)?;
                Memory::Window {
                    win: comm.register_window(&b, WindowFlags::COLL_SYMMETRIC)?,
                    buf: b,
                }
            }
            Mem::Pool => {
                let mut b = comm.buffer::<T>(len)?;
                b.fill(zero)?;
                Memory::Pool(b)
            }
            Mem::Symmetric => {
                let mut b = comm.symmetric::<T>(len)?;
                b.fill(zero)?;
                Memory::Symmetric(b)
            }
        })
    }

    /// What the mode's rows do not say on their own: memory that ended up unregistered.
    fn note(&self) -> Option<&'static str> {
        match self {
            Memory::Window { win, .. } if !win.is_active() => Some(
                "NCCL made no window (no symmetric memory support here): its rows are unregistered NCCL memory",
            ),
            _ => None,
        }
    }

    /// The first `len` elements.
    pub(crate) fn view(&mut self, len: usize) -> Result<DeviceViewMut<'_, T>> {
        let all = match self {
            Memory::Plain(b)
            | Memory::Registered { buf: b, .. }
            | Memory::Window { buf: b, .. } => b.as_view_mut(),
            Memory::Pool(b) => b.as_view_mut(),
            Memory::Symmetric(b) => b.as_view_mut(),
        };
        Ok(all.slice_mut(..len)?)
    }
}

/// Each mode's memory, allocated and registered once (collectively, in the same order on
/// every rank), before anything is timed; a mode this NCCL does not support is left out.
/// Returns the modes that run and the header lines that say what became of the others.
pub(crate) fn alloc_modes<'c, T: BenchVal>(
    comm: &'c Communicator,
    modes: &[Mem],
    send_max: usize,
    recv_max: usize,
) -> Result<(Vec<ModeMemory<'c, T>>, Vec<String>)> {
    let (mut mems, mut notes) = (Vec::new(), Vec::new());
    for &m in modes {
        let pair = Memory::alloc(comm, m, send_max)
            .and_then(|s| Ok((s, Memory::alloc(comm, m, recv_max)?)));
        match pair {
            Ok((s, rv)) => {
                if let Some(note) = s.note().or(rv.note()) {
                    notes.push(format!("# mode {}: {note}", m.name()));
                }
                mems.push((m, s, rv));
            }
            Err(e @ nccl_channel::Error::Unsupported { .. }) => {
                notes.push(format!("# mode {} skipped: {e}", m.name()));
            }
            Err(e) => return Err(e),
        }
    }
    // The default alone, where NCCL has no windows: plain memory, as NCCL would run.
    if mems.is_empty() && modes == [Mem::Symmetric] {
        notes.push("# mode 0 instead: no mode of -R runs here".into());
        let (s, rv) = (
            Memory::alloc(comm, Mem::Plain, send_max)?,
            Memory::alloc(comm, Mem::Plain, recv_max)?,
        );
        mems.push((Mem::Plain, s, rv));
    }
    Ok((mems, notes))
}

/// The pool registers a buffer for the collectives that gain from it: gives each
/// collective fresh pool buffers (the old ones returned and the pool trimmed first), as
/// an application gives each use its own.
pub(crate) fn fresh_pool<'c, T: BenchVal>(
    comm: &'c Communicator,
    mems: &mut [ModeMemory<'c, T>],
    send_max: usize,
    recv_max: usize,
) -> Result<()> {
    for (m, s, rv) in mems.iter_mut() {
        if *m == Mem::Pool {
            *s = Memory::Plain(DeviceBuffer::alloc(comm.context(), 0)?);
            *rv = Memory::Plain(DeviceBuffer::alloc(comm.context(), 0)?);
            comm.trim_pool()?;
            *s = Memory::alloc(comm, Mem::Pool, send_max)?;
            *rv = Memory::alloc(comm, Mem::Pool, recv_max)?;
        }
    }
    Ok(())
}

/// For the pool's mode: whether the collectives registered its send and receive buffers.
pub(crate) fn pool_registered<T: BenchVal>(mode: &ModeMemory<'_, T>) -> Option<(bool, bool)> {
    match mode {
        (_, Memory::Pool(s), Memory::Pool(rv)) => Some((s.is_registered(), rv.is_registered())),
        _ => None,
    }
}
