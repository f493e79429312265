//! Opening a library by path runs its code and trusts its symbols: `unsafe`.
fn main() {
    let _ = nccl_channel::nccl_sys::Nccl::load_from("/tmp/libnccl.so.2");
}
