//! Device selector strings (`cuda://0`, `cuda://GPU-<uuid>`, ...), UUIDs and PCI bus ids.

use std::fmt;
use std::str::FromStr;

use crate::digits::{parse_decimal, parse_hex};
use crate::{Error, Result};

/// A GPU's 16-byte UUID, displayed as `nvidia-smi -L` prints it.
///
/// ```
/// use cuda_hal::DeviceUuid;
/// let u: DeviceUuid = "GPU-5fdb056c-537e-3bd5-1c80-b2039499e800".parse()?;
/// assert_eq!(u.0[..2], [0x5f, 0xdb]);
/// assert_eq!(u.to_string(), "GPU-5fdb056c-537e-3bd5-1c80-b2039499e800");
/// // The `MIG-` prefix, any case, and no dashes are accepted too.
/// assert_eq!("5FDB056C537E3BD51C80B2039499E800".parse::<DeviceUuid>()?, u);
/// assert!("GPU-5fdb".parse::<DeviceUuid>().is_err());
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DeviceUuid(pub [u8; 16]);

impl fmt::Display for DeviceUuid {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower case.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceUuid({self})")
    }
}

impl FromStr for DeviceUuid {
    type Err = Error;

    /// Accepts `GPU-<uuid>`, `MIG-<uuid>` or a bare UUID, any case, with the dashes of the
    /// 8-4-4-4-12 form or none at all.
    fn from_str(s: &str) -> Result<Self> {
        let bad = |problem: &str| Error::InvalidUuid {
            input: s.to_string(),
            problem: problem.to_string(),
        };
        let body = strip_prefix_ci(s, "GPU-")
            .or_else(|| strip_prefix_ci(s, "MIG-"))
            .unwrap_or(s);
        let hex: String = if body.contains('-') {
            let groups: Vec<&str> = body.split('-').collect();
            let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
            if lens != [8, 4, 4, 4, 12] {
                return Err(bad(
                    "dashes must split it into groups of 8-4-4-4-12 hex digits",
                ));
            }
            groups.concat()
        } else {
            body.to_string()
        };
        if hex.len() != 32 {
            return Err(bad(&format!("it has {} hex digits, not 32", hex.len())));
        }
        let mut out = [0u8; 16];
        for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
            let text = std::str::from_utf8(chunk).map_err(|_| bad("not ASCII"))?;
            // Two hex digits: `from_str_radix` alone would also take `+f`.
            out[i] = parse_hex(text)
                .map(|b| b as u8)
                .ok_or_else(|| bad(&format!("{text:?} is not hexadecimal")))?;
        }
        Ok(DeviceUuid(out))
    }
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// A PCI bus id: domain, bus, device, function.
///
/// ```
/// use cuda_hal::PciBusId;
/// let id: PciBusId = "18:00.0".parse()?;
/// assert_eq!(id, PciBusId { domain: 0, bus: 0x18, device: 0, function: 0 });
/// assert_eq!(id.to_string(), "00000000:18:00.0");
/// assert!("18:00".parse::<PciBusId>().is_err(), "the function is missing");
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct PciBusId {
    /// PCI domain.
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number.
    pub device: u8,
    /// Function number.
    pub function: u8,
}

impl fmt::Display for PciBusId {
    /// `00000000:18:00.0`, as `nvidia-smi` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciBusId {
    type Err = Error;

    /// `[domain:]bus:device.function` in hex, any case (`0000:18:00.0`, `18:00.0`).
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::InvalidPciBusId {
            input: s.to_string(),
        };
        let (head, function) = s.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad()),
        };
        let hex = |t: &str, max_len: usize| {
            if t.is_empty() || t.len() > max_len {
                return Err(bad());
            }
            parse_hex(t).ok_or_else(bad)
        };
        let bus = hex(bus, 2)?;
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(PciBusId {
            domain: hex(domain, 8)?,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

/// Which device a `cuda://...` selector names (see [`Cuda::select`](crate::Cuda::select)).
///
/// Non-exhaustive: more ways to name a device may come.
///
/// ```
/// use cuda_hal::{DeviceSelector, Error};
/// assert_eq!("cuda://".parse::<DeviceSelector>()?, DeviceSelector::Default);
/// assert_eq!("cuda://3".parse::<DeviceSelector>()?, DeviceSelector::Ordinal(3));
/// let by_bus: DeviceSelector = "cuda://0000:18:00.0".parse()?;
/// assert!(matches!(by_bus, DeviceSelector::PciBusId(p) if p.bus == 0x18));
/// assert_eq!(by_bus.to_string(), "cuda://00000000:18:00.0");
/// let Err(Error::InvalidSelector { input, problem }) = "cuda://gpu1".parse::<DeviceSelector>() else {
///     panic!("not a selector");
/// };
/// assert_eq!((input.as_str(), problem.as_str()), ("cuda://gpu1", "\"gpu1\" is not an ordinal, a UUID or a PCI bus id"));
/// # Ok::<(), cuda_hal::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum DeviceSelector {
    /// `cuda://`: the default device (ordinal 0).
    Default,
    /// `cuda://<ordinal>`.
    Ordinal(usize),
    /// `cuda://GPU-<uuid>` or `cuda://MIG-<uuid>`.
    Uuid(DeviceUuid),
    /// `cuda://<pci bus id>`.
    PciBusId(PciBusId),
}

impl fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelector::Default => f.write_str("cuda://"),
            DeviceSelector::Ordinal(i) => write!(f, "cuda://{i}"),
            DeviceSelector::Uuid(u) => write!(f, "cuda://{u}"),
            DeviceSelector::PciBusId(p) => write!(f, "cuda://{p}"),
        }
    }
}

impl FromStr for DeviceSelector {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |problem: String| Error::InvalidSelector {
            input: s.to_string(),
            problem,
        };
        let rest = strip_prefix_ci(s, "cuda://")
            .ok_or_else(|| bad("it does not start with `cuda://`".into()))?;
        if rest.is_empty() {
            return Ok(DeviceSelector::Default);
        }
        if rest.bytes().all(|b| b.is_ascii_digit()) {
            return parse_decimal::<usize>(rest)
                .map(DeviceSelector::Ordinal)
                .ok_or_else(|| bad(format!("ordinal {rest} is too large")));
        }
        if strip_prefix_ci(rest, "GPU-").is_some() || strip_prefix_ci(rest, "MIG-").is_some() {
            return rest
                .parse::<DeviceUuid>()
                .map(DeviceSelector::Uuid)
                .map_err(|e| bad(e.to_string()));
        }
        if rest.contains(':') {
            return rest
                .parse::<PciBusId>()
                .map(DeviceSelector::PciBusId)
                .map_err(|e| bad(e.to_string()));
        }
        Err(bad(format!(
            "{rest:?} is not an ordinal, a UUID or a PCI bus id"
        )))
    }
}
