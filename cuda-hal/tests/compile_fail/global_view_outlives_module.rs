//! A global (and a view of it) borrows its module: it cannot outlive it.
use cuda_hal::{Context, DeviceView, Module};

fn main() {
    fn table(ctx: &Context) -> DeviceView<'static, f32> {
        let m = Module::from_ptx(ctx, "").unwrap();
        let g = m.global::<f32>("table").unwrap();
        g.as_view()
    }
    let _ = table;
}
