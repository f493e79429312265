//! NCCL's group state belongs to a thread: a group cannot be ended on another one.
use nccl_channel::Group;
use nccl_channel::nccl_sys::Nccl;

fn main() {
    fn move_away(nccl: &'static Nccl) {
        let g = Group::start(nccl).unwrap();
        std::thread::spawn(move || g.end());
    }
    let _ = move_away;
}
