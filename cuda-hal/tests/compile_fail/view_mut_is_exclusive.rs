//! An exclusive view excludes every other view of its memory while it lives.
use cuda_hal::{Context, DeviceBuffer};

fn main() {
    fn alias(ctx: &Context) {
        let mut b = DeviceBuffer::<f32>::zeroed(ctx, 4).unwrap();
        let mut m = b.as_view_mut();
        let shared = m.as_view();
        let mut again = m.reborrow();
        again.fill(1.0).unwrap();
        let _ = shared.to_vec();
    }
    let _ = alias;
}
