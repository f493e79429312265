//! Opening a library by path runs its code and trusts its symbols: `unsafe`.
fn main() {
    let _ = cuda_hal::cuda_sys::Driver::load_from("/tmp/libcuda.so.1");
}
