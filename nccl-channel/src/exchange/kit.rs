//! What a communicator keeps for its exchanges ([`Kit`]): the exchange's own stream, the
//! device buffers NCCL gathers between, and the page-locked memory the records go up from
//! and come down to.

use std::mem::ManuallyDrop;

use cuda_hal::{Context, DeviceBuffer, PinnedBuffer, Stream};

use super::record::WORDS;
use crate::Result;

/// What a communicator keeps for its exchanges: made at the first, reused after. The
/// page-locked buffers are read and written by the stream's copies: they are freed only
/// once the stream is idle (a failed wait leaks the kit whole; a drop that finds the
/// stream busy leaks them).
pub(crate) struct Kit {
    pub(super) stream: Stream,
    pub(super) send: DeviceBuffer<u64>,
    pub(super) recv: DeviceBuffer<u64>,
    up: ManuallyDrop<PinnedBuffer<u64>>,
    down: ManuallyDrop<PinnedBuffer<u64>>,
}

impl Drop for Kit {
    fn drop(&mut self) {
        if self.stream.is_idle().unwrap_or(false) {
            // SAFETY: dropped once, here; no copy of the stream uses them any more.
            unsafe {
                ManuallyDrop::drop(&mut self.up);
                ManuallyDrop::drop(&mut self.down);
            }
        }
    }
}

impl Kit {
    /// For a communicator of `ranks` ranks on `ctx`.
    pub(crate) fn new(ctx: &Context, ranks: usize) -> Result<Kit> {
        Ok(Kit {
            stream: Stream::non_blocking(ctx)?,
            send: DeviceBuffer::zeroed(ctx, WORDS)?,
            recv: DeviceBuffer::zeroed(ctx, WORDS * ranks)?,
            up: ManuallyDrop::new(PinnedBuffer::zeroed(ctx, WORDS)?),
            down: ManuallyDrop::new(PinnedBuffer::zeroed(ctx, WORDS * ranks)?),
        })
    }

    /// Enqueues the record's upload.
    pub(super) fn upload(&mut self, record: &[u64; WORDS]) -> Result<()> {
        self.up.copy_from_slice(record);
        // SAFETY: `up` is page-locked memory of the kit, which is dropped only once the
        // stream is done (a failed wait leaks the kit), and not written again before the
        // next exchange, which waits for this one first.
        unsafe { self.send.copy_from_host_async(&self.up, &self.stream) }?;
        Ok(())
    }

    /// Enqueues the download of every rank's record.
    pub(super) fn download(&mut self) -> Result<()> {
        // SAFETY: as for `upload`; `down` is read only after the stream is done.
        unsafe { self.recv.copy_to_host_async(&mut self.down, &self.stream) }?;
        Ok(())
    }
}

impl Kit {
    /// Every rank's record, as the last download left them (read once the stream is done).
    pub(super) fn down(&self) -> &[u64] {
        &self.down
    }
}
