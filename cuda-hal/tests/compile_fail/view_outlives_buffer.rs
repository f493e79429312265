//! A view borrows its buffer: it cannot be kept once the buffer is dropped.
use cuda_hal::{Context, DeviceBuffer, DeviceView};

fn main() {
    fn view(ctx: &Context) -> DeviceView<'static, f32> {
        let b = DeviceBuffer::<f32>::zeroed(ctx, 4).unwrap();
        b.slice(1..).unwrap()
    }
    let _ = view;
}
