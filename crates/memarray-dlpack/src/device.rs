//! Devices as plain values: the four DLPack device types memarray holds, and the mapping to
//! and from `DLDevice` and [`Location`].

use std::fmt;

use dlpack_rs::ffi::{DLDevice, DLDeviceType};
use memarray_core::Location;

use crate::error::DlpackError;

/// The DLPack device types memarray holds. Every other code is refused by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// `kDLCPU` (1): ordinary host memory.
    Cpu,
    /// `kDLCUDA` (2): CUDA device memory.
    Cuda,
    /// `kDLCUDAHost` (3): pinned host memory from `cudaMallocHost`.
    CudaHost,
    /// `kDLCUDAManaged` (13): managed memory from `cudaMallocManaged`.
    CudaManaged,
}

impl DeviceType {
    /// The `DLDeviceType` code.
    pub const fn code(self) -> u32 {
        match self {
            DeviceType::Cpu => DLDeviceType::kDLCPU,
            DeviceType::Cuda => DLDeviceType::kDLCUDA,
            DeviceType::CudaHost => DLDeviceType::kDLCUDAHost,
            DeviceType::CudaManaged => DLDeviceType::kDLCUDAManaged,
        }
    }

    /// The device type for a `DLDeviceType` code; [`DlpackError::UnknownDeviceType`] names
    /// any other code.
    pub fn from_code(code: u32) -> Result<DeviceType, DlpackError> {
        match code {
            DLDeviceType::kDLCPU => Ok(DeviceType::Cpu),
            DLDeviceType::kDLCUDA => Ok(DeviceType::Cuda),
            DLDeviceType::kDLCUDAHost => Ok(DeviceType::CudaHost),
            DLDeviceType::kDLCUDAManaged => Ok(DeviceType::CudaManaged),
            _ => Err(DlpackError::UnknownDeviceType { code }),
        }
    }
}

impl TryFrom<u32> for DeviceType {
    type Error = DlpackError;
    fn try_from(code: u32) -> Result<Self, DlpackError> {
        DeviceType::from_code(code)
    }
}

impl From<DeviceType> for u32 {
    fn from(kind: DeviceType) -> u32 {
        kind.code()
    }
}

/// A DLPack device: a type and an ordinal (0 for CPU, pinned and managed memory).
///
/// # Example
///
/// ```
/// use memarray_core::Location;
/// use memarray_dlpack::{Device, DeviceType};
///
/// assert_eq!(Device::cuda(1).location(), Location::Device(1));
/// assert_eq!(Device::CPU.location(), Location::Host);
/// assert!(DeviceType::from_code(99).is_err(), "unknown device types are refused");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    /// The device type.
    pub kind: DeviceType,
    /// The device ordinal.
    pub id: i32,
}

impl Device {
    /// The host, `(kDLCPU, 0)`.
    pub const CPU: Device = Device {
        kind: DeviceType::Cpu,
        id: 0,
    };

    /// CUDA device `id`.
    pub const fn cuda(id: i32) -> Device {
        Device {
            kind: DeviceType::Cuda,
            id,
        }
    }

    /// The `DLDevice` struct.
    pub const fn to_dl(self) -> DLDevice {
        DLDevice {
            device_type: self.kind.code(),
            device_id: self.id,
        }
    }

    /// Checks a `DLDevice`: known type ([`DlpackError::UnknownDeviceType`]) and a
    /// non-negative id ([`DlpackError::NegativeDeviceId`]).
    pub fn from_dl(dl: DLDevice) -> Result<Device, DlpackError> {
        let kind = DeviceType::from_code(dl.device_type)?;
        if dl.device_id < 0 {
            return Err(DlpackError::NegativeDeviceId {
                code: dl.device_type,
                id: dl.device_id,
            });
        }
        Ok(Device {
            kind,
            id: dl.device_id,
        })
    }

    /// Where the data can be read without a copy by memarray: CUDA memory is on its device;
    /// CPU, pinned and managed memory count as host memory.
    pub const fn location(self) -> Location {
        match self.kind {
            DeviceType::Cuda => Location::Device(self.id as u32),
            DeviceType::Cpu | DeviceType::CudaHost | DeviceType::CudaManaged => Location::Host,
        }
    }
}

impl From<Location> for Device {
    /// Host data exports as `(kDLCPU, 0)`, device data as `(kDLCUDA, id)`.
    fn from(location: Location) -> Device {
        match location {
            Location::Host => Device::CPU,
            // Ordinals come from the CUDA driver, which counts them in an `int`.
            Location::Device(id) => Device::cuda(id as i32),
        }
    }
}

impl From<Device> for DLDevice {
    fn from(device: Device) -> DLDevice {
        device.to_dl()
    }
}

impl TryFrom<DLDevice> for Device {
    type Error = DlpackError;
    fn try_from(dl: DLDevice) -> Result<Self, DlpackError> {
        Device::from_dl(dl)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.kind {
            DeviceType::Cpu => "cpu",
            DeviceType::Cuda => "cuda",
            DeviceType::CudaHost => "cuda_host",
            DeviceType::CudaManaged => "cuda_managed",
        };
        write!(f, "{name}:{}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for kind in [
            DeviceType::Cpu,
            DeviceType::Cuda,
            DeviceType::CudaHost,
            DeviceType::CudaManaged,
        ] {
            assert_eq!(DeviceType::from_code(kind.code()).unwrap(), kind);
            let dev = Device { kind, id: 3 };
            assert_eq!(Device::from_dl(dev.to_dl()).unwrap(), dev);
        }
        assert_eq!(DeviceType::Cpu.code(), 1);
        assert_eq!(DeviceType::Cuda.code(), 2);
        assert_eq!(DeviceType::CudaHost.code(), 3);
        assert_eq!(DeviceType::CudaManaged.code(), 13);
    }

    #[test]
    fn unknown_codes_are_named() {
        for code in [0, 4, 7, 10, 14, 20, 99] {
            let e = DeviceType::from_code(code).unwrap_err();
            assert_eq!(e, DlpackError::UnknownDeviceType { code });
            assert!(
                e.to_string().contains(&format!("device type {code} ")),
                "{e}"
            );
        }
    }

    #[test]
    fn negative_ids_are_refused() {
        let dl = DLDevice {
            device_type: 2,
            device_id: -1,
        };
        assert_eq!(
            Device::from_dl(dl).unwrap_err(),
            DlpackError::NegativeDeviceId { code: 2, id: -1 }
        );
    }

    #[test]
    fn locations_map_to_devices() {
        assert_eq!(Device::from(Location::Host), Device::CPU);
        assert_eq!(Device::from(Location::Device(2)), Device::cuda(2));
        assert_eq!(Device::cuda(2).location(), Location::Device(2));
        let managed = Device {
            kind: DeviceType::CudaManaged,
            id: 0,
        };
        assert_eq!(managed.location(), Location::Host);
        assert_eq!(Device::cuda(1).to_string(), "cuda:1");
    }
}
