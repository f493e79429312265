// Enqueueing this crate's work on cudarc's stream needs the caller's promise that cudarc
// does not capture that stream on another thread meanwhile.
use std::sync::Arc;

use cuda_hal::{Context, Stream};
use cudarc::driver::CudaStream;

fn adopt(ctx: &Context, theirs: &Arc<CudaStream>) -> cuda_hal::Result<Stream> {
    Stream::from_cudarc(ctx, theirs)
}

fn main() {
    let _ = adopt;
}
