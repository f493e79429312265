//! A registration is released on its communicator's thread: it cannot move to another.
use nccl_channel::Communicator;

fn main() {
    fn send_away(comm: &Communicator, buf: &cuda_hal::DeviceBuffer<f32>) {
        let reg = comm.register(buf).unwrap();
        std::thread::scope(|s| {
            s.spawn(move || drop(reg));
        });
    }
    let _ = send_away;
}
