//! "Current" is a property of a thread: a guard cannot move to another one.
use cuda_hal::Context;

fn main() {
    fn needs_send<T: Send>(_: T) {}
    fn with(ctx: &Context) {
        let guard = ctx.bind().unwrap();
        needs_send(guard);
    }
    let _ = with;
}
