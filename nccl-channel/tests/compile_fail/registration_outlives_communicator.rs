//! A registration borrows its communicator: it cannot outlive it (its release needs the
//! communicator's handle).
use nccl_channel::{Communicator, Registration};

fn main() {
    fn keep(comm: Communicator, buf: &cuda_hal::DeviceBuffer<f32>) -> Registration<'static> {
        comm.register(buf).unwrap()
    }
    let _ = keep;
}
