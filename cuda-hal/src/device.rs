//! [`Device`]: one GPU, its properties and its primary context.

use std::ffi::c_char;

use cuda_sys::{CUdevice, CUdevice_attribute, CUuuid};

use crate::selector::DeviceSelector;
use crate::{Cuda, DeviceUuid, Error, PciBusId, Result};

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

/// Finding devices: by ordinal, by UUID, by a selector string.
impl Cuda {
    /// The device with this ordinal ([`Error::NoSuchDevice`], listing the devices there
    /// are, past the last).
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, Error};
    /// let (cuda, _world) = MockDriver::with_devices(1).build_with(Cuda::from_driver)?;
    /// assert_eq!(cuda.device(0)?.ordinal(), 0);
    /// let Err(Error::NoSuchDevice { selector, available }) = cuda.device(3) else {
    ///     panic!("there is one device");
    /// };
    /// assert_eq!(selector, "ordinal 3");
    /// assert_eq!(available, ["GPU 0: Mock GPU 0 (UUID: GPU-5fdb056c-537e-3bd5-1c80-b2039499e800)"]);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    #[doc(alias = "cuDeviceGet")]
    pub fn device(&self, ordinal: usize) -> Result<Device> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(self.no_such_device(format!("ordinal {ordinal}")));
        }
        Device::get(self, ordinal as i32)
    }

    /// All devices, by ordinal.
    pub fn devices(&self) -> Result<Vec<Device>> {
        (0..self.device_count()?).map(|i| self.device(i)).collect()
    }

    /// The device whose UUID is `uuid` (all 16 bytes compared).
    pub fn device_by_uuid(&self, uuid: &DeviceUuid) -> Result<Device> {
        for d in self.devices()? {
            if d.uuid()? == *uuid {
                return Ok(d);
            }
        }
        Err(self.no_such_device(uuid.to_string()))
    }

    /// The device a selector string names: `cuda://`, `cuda://<ordinal>`,
    /// `cuda://GPU-<uuid>`, `cuda://MIG-<uuid>` or `cuda://<pci bus id>`.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, Error};
    /// let (cuda, _world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let one = cuda.device(1)?;
    /// assert_eq!(cuda.select("cuda://")?.ordinal(), 0);
    /// assert_eq!(cuda.select("cuda://1")?, one);
    /// assert_eq!(cuda.select("cuda://GPU-5fdb056c-537e-3bd5-1c80-b2039499e801")?, one);
    /// assert_eq!(cuda.select("cuda://0000:19:00.0")?, one);
    /// // Malformed, or well formed but absent: typed errors that say which.
    /// assert!(matches!(cuda.select("gpu:1"), Err(Error::InvalidSelector { .. })));
    /// assert!(matches!(cuda.select("cuda://7"), Err(Error::NoSuchDevice { .. })));
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn select(&self, selector: &str) -> Result<Device> {
        // The error names the selector as written (`MIG-`, the case and dashes given).
        self.select_parsed(&selector.parse::<DeviceSelector>()?)
            .map_err(|e| match e {
                Error::NoSuchDevice { available, .. } => Error::NoSuchDevice {
                    selector: selector.to_string(),
                    available,
                },
                e => e,
            })
    }

    /// The device a parsed selector names.
    ///
    /// ```
    /// use cuda_mock::MockDriver;
    /// use cuda_hal::{Cuda, DeviceSelector};
    /// let (cuda, _world) = MockDriver::with_devices(2).build_with(Cuda::from_driver)?;
    /// let wanted: DeviceSelector = "cuda://1".parse()?;
    /// assert_eq!(cuda.select_parsed(&wanted)?.ordinal(), 1);
    /// # Ok::<(), cuda_hal::Error>(())
    /// ```
    pub fn select_parsed(&self, selector: &DeviceSelector) -> Result<Device> {
        match selector {
            DeviceSelector::Default => {
                if self.device_count()? == 0 {
                    return Err(self.no_such_device("cuda:// (default device)".into()));
                }
                self.device(0)
            }
            DeviceSelector::Ordinal(i) => self
                .device(*i)
                .map_err(|_| self.no_such_device(selector.to_string())),
            DeviceSelector::Uuid(u) => self
                .device_by_uuid(u)
                .map_err(|_| self.no_such_device(selector.to_string())),
            DeviceSelector::PciBusId(p) => {
                for d in self.devices()? {
                    if d.pci_bus_id()? == *p {
                        return Ok(d);
                    }
                }
                Err(self.no_such_device(selector.to_string()))
            }
        }
    }

    #[cold]
    fn no_such_device(&self, selector: String) -> Error {
        let available = match self.devices() {
            Ok(ds) => ds
                .iter()
                .map(|d| {
                    d.describe()
                        .unwrap_or_else(|e| format!("{}: {e}", d.ordinal()))
                })
                .collect(),
            Err(e) => vec![format!("(the devices could not be listed: {e})")],
        };
        Error::NoSuchDevice {
            selector,
            available,
        }
    }
}
