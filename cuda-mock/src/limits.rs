//! The launch limits every simulated device has (those of an H100, compute capability
//! 9.0), shared by device attributes, launch checks, function attributes and occupancy.

/// Threads in one block.
pub(super) const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Block dimensions (x, y, z).
pub(super) const MAX_BLOCK_DIM: [u32; 3] = [1024, 1024, 64];
/// Grid dimensions (x, y, z).
pub(super) const MAX_GRID_DIM: [u32; 3] = [i32::MAX as u32, 65535, 65535];
/// Dynamic shared memory a block may use without opting in (48 KiB).
pub(super) const DEFAULT_DYNAMIC_SHARED: u32 = 48 << 10;
/// Shared memory a block may use after opting in (`cuFuncSetAttribute`): 227 KiB.
pub(super) const MAX_SHARED_PER_BLOCK_OPTIN: u32 = 227 << 10;
/// Shared memory of one multiprocessor: 228 KiB.
pub(super) const SHARED_PER_MULTIPROCESSOR: u32 = 228 << 10;
/// Resident threads per multiprocessor.
pub(super) const MAX_THREADS_PER_MULTIPROCESSOR: u32 = 2048;
/// Resident blocks per multiprocessor.
pub(super) const MAX_BLOCKS_PER_MULTIPROCESSOR: u32 = 32;
/// Threads of a warp: blocks occupy whole warps.
pub(super) const WARP: u32 = 32;
/// Registers every simulated function reports using per thread.
pub(super) const REGISTERS_PER_THREAD: i32 = 32;

/// Whether a grid and a block are a valid launch shape: every dimension non-zero and
/// within its limit, and at most [`MAX_THREADS_PER_BLOCK`] threads in a block.
pub(super) fn valid_shape(grid: [u32; 3], block: [u32; 3]) -> bool {
    let within = |d: [u32; 3], max: [u32; 3]| d.iter().zip(max).all(|(v, m)| (1..=m).contains(v));
    let threads = block
        .iter()
        .fold(1u64, |n, v| n.saturating_mul(u64::from(*v)));
    within(grid, MAX_GRID_DIM)
        && within(block, MAX_BLOCK_DIM)
        && threads <= u64::from(MAX_THREADS_PER_BLOCK)
}

/// Blocks of `threads` threads, each with `shared` bytes of dynamic shared memory, that
/// fit on one multiprocessor at once: threads are counted in whole warps, at most
/// [`MAX_BLOCKS_PER_MULTIPROCESSOR`] blocks, and the blocks' shared memory must fit in
/// [`SHARED_PER_MULTIPROCESSOR`]. 0 when one block does not fit (`threads` 0 or over the
/// block limit, or `shared` over `max_shared`, the function's allowance).
pub(super) fn blocks_per_multiprocessor(threads: u32, shared: usize, max_shared: u32) -> u32 {
    if threads == 0 || threads > MAX_THREADS_PER_BLOCK || shared > max_shared as usize {
        return 0;
    }
    let warps = threads.div_ceil(WARP) * WARP;
    let by_threads = (MAX_THREADS_PER_MULTIPROCESSOR / warps).min(MAX_BLOCKS_PER_MULTIPROCESSOR);
    match shared {
        0 => by_threads,
        s => by_threads.min(u32::try_from(SHARED_PER_MULTIPROCESSOR as usize / s).unwrap_or(0)),
    }
}
