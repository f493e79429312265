//! The test rigs shared by the simulated-driver tests: a machine of two devices and the
//! check that the sanitizer saw nothing and nothing was left alive.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use cuda_hal::{Context, Cuda};
use cuda_mock::{MockDriver, MockWorld};

/// A simulated machine built from `driver`, and device 0's context.
pub fn rig_with(driver: MockDriver) -> (Cuda, MockWorld, Context) {
    let (cuda, world) = driver.build_with(Cuda::from_driver).unwrap();
    let ctx = cuda.device(0).unwrap().primary_context().unwrap();
    (cuda, world, ctx)
}

/// Two simulated devices, and device 0's context.
pub fn rig() -> (Cuda, MockWorld, Context) {
    rig_with(MockDriver::with_devices(2))
}

/// No violation was seen, nothing is left once everything is dropped, and no context was
/// released before what lived in it.
pub fn assert_clean(world: &MockWorld) {
    let v = world.violations();
    assert!(v.is_empty(), "sanitizer:\n{}", v.join("\n"));
    assert!(world.live().is_empty(), "leaked: {:?}", world.live());
    assert_eq!(world.order_violations(), 0);
}
