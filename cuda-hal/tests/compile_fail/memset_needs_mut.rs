//! Writing device memory takes the buffer mutably, like every other write.
use cuda_hal::{Context, DeviceBuffer};

fn main() {
    fn clear(ctx: &Context) {
        let buf = DeviceBuffer::<u8>::alloc(ctx, 4).unwrap();
        buf.memset_bytes(0).unwrap();
    }
    let _ = clear;
}
