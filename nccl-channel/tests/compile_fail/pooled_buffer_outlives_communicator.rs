//! A pooled buffer belongs to its communicator's pool: it cannot outlive the communicator.
use nccl_channel::{Communicator, PooledBuffer};

fn main() {
    fn keep(comm: Communicator) -> PooledBuffer<'static, f32> {
        comm.buffer::<f32>(16).unwrap()
    }
    let _ = keep;
}
