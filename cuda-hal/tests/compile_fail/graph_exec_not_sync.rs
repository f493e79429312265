//! The driver does not serialise calls on one executable graph: it cannot be shared.
use cuda_hal::{GraphExec, Stream};

fn main() {
    fn launch_from_two_threads(g: &GraphExec, a: &Stream, b: &Stream) {
        std::thread::scope(|s| {
            s.spawn(|| g.launch(a));
            s.spawn(|| g.launch(b));
        });
    }
    let _ = launch_from_two_threads;
}
