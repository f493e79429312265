//! A kernel launch's shape: plain data, which errors name too.

/// A launch's shape: blocks in the grid, threads in a block, and dynamic shared memory
/// per block.
///
/// ```
/// use cuda_hal::LaunchConfig;
/// // One thread per element of 1000, in blocks of 256: 4 blocks.
/// let c = LaunchConfig::for_elements(1000, 256).with_shared_mem(1024);
/// assert_eq!((c.grid, c.block, c.shared_mem_bytes), ([4, 1, 1], [256, 1, 1], 1024));
/// assert_eq!(LaunchConfig::new([8, 8, 1], [16, 16, 1]).threads_per_block(), 256);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a launch configuration does nothing until it is passed to a launch"]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

static_assertions::assert_impl_all!(LaunchConfig: Send, Sync, Copy, std::fmt::Debug);

impl LaunchConfig {
    /// A grid of `grid` blocks of `block` threads, without dynamic shared memory.
    pub const fn new(grid: [u32; 3], block: [u32; 3]) -> Self {
        LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
        }
    }

    /// A one-dimensional grid of `grid` blocks of `block` threads.
    pub const fn linear(grid: u32, block: u32) -> Self {
        Self::new([grid, 1, 1], [block, 1, 1])
    }

    /// One thread per element for `n` elements, in blocks of `block` threads: a
    /// one-dimensional grid of `ceil(n / block)` blocks (saturated at `u32::MAX`, which the
    /// driver refuses). `n` 0 gives an empty grid, which a launch refuses.
    pub fn for_elements(n: usize, block: u32) -> Self {
        let blocks = n.div_ceil(block.max(1) as usize);
        Self::linear(u32::try_from(blocks).unwrap_or(u32::MAX), block)
    }

    /// The same shape with `bytes` of dynamic shared memory per block.
    pub const fn with_shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem_bytes = bytes;
        self
    }

    /// Threads in one block.
    /// (Saturating: three `u32`s can multiply past `u64::MAX`; the launch refuses such a
    /// block anyway.)
    #[must_use]
    pub fn threads_per_block(&self) -> u64 {
        self.block
            .iter()
            .fold(1u64, |n, v| n.saturating_mul(u64::from(*v)))
    }
}
