//! A communicator is used by one thread at a time (NCCL's rule): it cannot be shared.
use nccl_channel::Communicator;

fn main() {
    fn share(comm: &Communicator) {
        std::thread::scope(|s| {
            s.spawn(|| comm.rank());
        });
    }
    let _ = share;
}
