//! [`Device`]: one GPU, its properties and its primary context.

use std::ffi::c_char;

use cuda_sys::{CUdevice, CUdevice_attribute, CUuuid};

use crate::{Context, Cuda, DeviceUuid, PciBusId, Result};

/// One CUDA device.
///
/// ```
/// use cuda_hal::cuda_sys::CUdevice_attribute;
/// use cuda_mock::MockDriver;
/// use cuda_hal::Cuda;
///
/// let (cuda, _world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
/// let gpu = cuda.device(1)?;
/// assert_eq!(gpu.name()?, "Mock GPU 1");
/// assert_eq!(gpu.total_memory()?, 16 << 30);
/// assert_eq!(gpu.compute_capability()?, (9, 0));
/// assert_eq!(gpu.pci_bus_id()?.to_string(), "00000000:19:00.0");
/// let sms = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
/// assert_eq!(gpu.attribute(sms)?, 132);
/// assert!(gpu.can_access_peer(&cuda.device(0)?)?);
/// assert_eq!(
///     gpu.describe()?,
///     "GPU 1: Mock GPU 1 (UUID: GPU-5fdb056c-537e-3bd5-1c80-b2039499e801)"
/// );
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone)]
pub struct Device {
    cuda: Cuda,
    raw: CUdevice,
    ordinal: i32,
}

static_assertions::assert_impl_all!(Device: Send, Sync, Clone, std::fmt::Debug);

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw && std::ptr::eq(self.cuda.driver(), other.cuda.driver())
    }
}
impl Eq for Device {}

impl Device {
    pub(crate) fn get(cuda: &Cuda, ordinal: i32) -> Result<Device> {
        let mut raw = 0;
        // SAFETY: valid out-pointer.
        unsafe { call!(cuda, cuDeviceGet(&mut raw, ordinal)) }?;
        Ok(Device {
            cuda: cuda.clone(),
            raw,
            ordinal,
        })
    }

    /// The driver this device belongs to.
    #[must_use]
    pub fn cuda(&self) -> &Cuda {
        &self.cuda
    }

    /// The device ordinal.
    #[must_use]
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The raw `CUdevice`.
    #[must_use]
    pub fn as_raw(&self) -> CUdevice {
        self.raw
    }

    /// The device's name (`NVIDIA H200`).
    #[doc(alias = "cuDeviceGetName")]
    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and we pass that length.
        unsafe { call!(self.cuda, cuDeviceGetName(buf.as_mut_ptr(), 256, self.raw)) }?;
        Ok(c_string(&buf))
    }

    /// The UUID (for a MIG instance, the MIG UUID).
    #[doc(alias = "cuDeviceGetUuid")]
    pub fn uuid(&self) -> Result<DeviceUuid> {
        let mut u = CUuuid::default();
        // SAFETY: valid out-pointer.
        unsafe { call!(self.cuda, cuDeviceGetUuid(&mut u, self.raw)) }?;
        Ok(DeviceUuid(u.bytes.map(|b| b as u8)))
    }

    /// Total device memory in bytes.
    #[doc(alias = "cuDeviceTotalMem")]
    pub fn total_memory(&self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: valid out-pointer.
        unsafe { call!(self.cuda, cuDeviceTotalMem(&mut n, self.raw)) }?;
        Ok(n)
    }

    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The PCI bus id.
    #[doc(alias = "cuDeviceGetPCIBusId")]
    pub fn pci_bus_id(&self) -> Result<PciBusId> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: the buffer holds 64 bytes and we pass that length.
        unsafe {
            call!(
                self.cuda,
                cuDeviceGetPCIBusId(buf.as_mut_ptr(), 64, self.raw)
            )
        }?;
        c_string(&buf).parse()
    }

    /// Any device attribute.
    #[doc(alias = "cuDeviceGetAttribute")]
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: valid out-pointer; the driver validates the attribute.
        unsafe { call!(self.cuda, cuDeviceGetAttribute(&mut v, attribute, self.raw)) }?;
        Ok(v)
    }

    /// Whether this device can access `peer`'s memory directly.
    #[doc(alias = "cuDeviceCanAccessPeer")]
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        let mut v = 0;
        // SAFETY: valid out-pointer.
        unsafe { call!(self.cuda, cuDeviceCanAccessPeer(&mut v, self.raw, peer.raw)) }?;
        Ok(v != 0)
    }

    /// Retains the device's primary context (released when the last clone drops).
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn primary_context(&self) -> Result<Context> {
        Context::retain_primary(self)
    }

    /// One line as `nvidia-smi -L` prints it: `GPU 0: NVIDIA H200 (UUID: GPU-...)`.
    pub fn describe(&self) -> Result<String> {
        Ok(format!(
            "GPU {}: {} (UUID: {})",
            self.ordinal,
            self.name()?,
            self.uuid()?
        ))
    }
}

fn c_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
