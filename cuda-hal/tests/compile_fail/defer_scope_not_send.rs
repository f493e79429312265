//! A deferral scope (an NCCL group's) belongs to the thread that opened it.
use cuda_hal::DeferScope;

fn main() {
    let scope = DeferScope::open();
    std::thread::spawn(move || drop(scope));
}
