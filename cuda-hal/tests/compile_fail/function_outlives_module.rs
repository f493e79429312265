//! A function borrows its module: it cannot be kept once the module is dropped (the
//! module would be unloaded under it).
use cuda_hal::{Context, Function, Module};

fn main() {
    fn first_kernel(ctx: &Context, ptx: &str) -> Function<'static> {
        let module = Module::from_ptx(ctx, ptx).unwrap();
        module.function("kernel").unwrap()
    }
    let _ = first_kernel;
}
