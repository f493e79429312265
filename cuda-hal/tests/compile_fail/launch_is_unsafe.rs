//! Launching a kernel is `unsafe`: no type system can check what the kernel does.
use cuda_hal::{DeviceBuffer, Function, LaunchConfig, Stream};

fn main() {
    fn run(f: &Function<'_>, s: &Stream, data: &mut DeviceBuffer<f32>) {
        let _ = f.launch(s, LaunchConfig::for_elements(data.len(), 256), (data,));
    }
    let _ = run;
}
