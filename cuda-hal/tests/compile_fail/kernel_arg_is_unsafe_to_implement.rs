//! `KernelArg` is an unsafe trait: an implementation that hands a kernel an address must
//! keep that memory alive (as `DeviceSlice::used_on` does), which the compiler cannot check.
use cuda_hal::cuda_sys::CUdeviceptr;
use cuda_hal::{DeviceBuffer, KernelArg, Result, Stream};

struct Addr<'a>(&'a DeviceBuffer<u32>);

impl KernelArg for Addr<'_> {
    type Raw = CUdeviceptr;
    fn prepare(&self, _: &Stream) -> Result<CUdeviceptr> {
        Ok(self.0.as_raw())
    }
}

fn main() {}
