//! A library's kernels borrow it, and so do the functions they give.
use cuda_hal::{Context, Cuda, Function, Library};

fn main() {
    fn kernel_in(cuda: &Cuda, ctx: &Context, ptx: &str) -> Function<'static> {
        let library = Library::from_ptx(cuda, ptx).unwrap();
        let kernel = library.kernel("kernel").unwrap();
        kernel.function(ctx).unwrap()
    }
    let _ = kernel_in;
}
