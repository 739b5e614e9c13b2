//! Devices and targets as Python spells them, parsed in one place: `"cpu"`,
//! `"cuda"`, `"cuda:N"`, an int N, a DLPack `(device_type, id)` pair or a torch.device for
//! `device=` arguments; DLPack device codes (memarray-dlpack's `DeviceType`, the one
//! spelling of a device type in the binding) for `move_memory` and `__dlpack__`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use std::sync::Arc;

use memarray_core::Location;
use memarray_cuda::Device;
use memarray_cuda::array::RawArray;
use memarray_dlpack::DeviceType;

use crate::convert;
use crate::errors::IntoPyResult;

/// DLPack device type codes memarray uses.
pub const KDLCPU: i64 = DeviceType::Cpu.code() as i64;

/// CUDA device memory.
pub const KDLCUDA: i64 = DeviceType::Cuda.code() as i64;

/// Pinned host memory.
pub const KDLCUDAHOST: i64 = DeviceType::CudaHost.code() as i64;

/// Managed memory.
pub const KDLCUDAMANAGED: i64 = DeviceType::CudaManaged.code() as i64;

/// A move's destination as parsed from Python, resolved against the array's state
/// (its default device) under the array's mutex.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target {
    /// The host.
    Host,
    /// A CUDA device; `None` is the array's default device.
    Cuda(Option<u32>),
    /// Where the data is now.
    Current,
}

impl Target {
    /// A device as `zeros(device=...)` spells it; plain "cuda" is the array's own device.
    pub(crate) fn from_device(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<pyo3::types::PyString>() {
            let s = convert::text(obj, "device")?;
            if matches!(s.trim().to_ascii_lowercase().as_str(), "cuda" | "gpu") {
                return Ok(Target::Cuda(None));
            }
        }
        Ok(match parse_device(Some(obj))? {
            Location::Host => Target::Host,
            Location::Device(id) => Target::Cuda(Some(id)),
        })
    }

    /// A device as `zeros(device=...)` spells it with `move_memory`'s `device_id` beside it:
    /// `"cuda"` plus an id is that device; an id that contradicts `"cuda:N"`, or any id with
    /// the host, is a ValueError (never silently dropped).
    pub(crate) fn from_device_with_id(
        obj: &Bound<'_, PyAny>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let target = Self::from_device(obj)?;
        let Some(id) = convert::opt_int::<i64>(device_id, "device_id")? else {
            return Ok(target);
        };
        let id = u32::try_from(id)
            .map_err(|_| PyValueError::new_err(format!("invalid device_id {id}")))?;
        match target {
            Target::Cuda(None) => Ok(Target::Cuda(Some(id))),
            Target::Cuda(Some(n)) if n == id => Ok(target),
            Target::Cuda(Some(n)) => Err(PyValueError::new_err(format!(
                "device cuda:{n} and device_id={id} disagree: give one of them"
            ))),
            Target::Host | Target::Current => Err(PyValueError::new_err(format!(
                "device_id={id} was given with a host device: the host has no device id"
            ))),
        }
    }

    /// Parses Python's `device_type` and optional `device_id` arguments.
    /// The target of a `(device_type, device_id)` pair of arguments, as `move_memory` and
    /// `get_dlpack` take them: a DLPack device type int with an optional id, or any device
    /// word (`"cpu"`, `"cuda:1"`, a torch.device, a DLPack pair) with an id that must
    /// agree.
    pub(crate) fn from_pair_args(
        device_type: &Bound<'_, PyAny>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        if device_type.is_instance_of::<pyo3::types::PyInt>() || device_type.hasattr("__index__")? {
            Self::parse_args(device_type, device_id)
        } else {
            Self::from_device_with_id(device_type, device_id)
        }
    }

    pub(crate) fn parse_args(
        device_type: &Bound<'_, PyAny>,
        device_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Self::parse(
            convert::int(device_type, "device_type")?,
            convert::opt_int(device_id, "device_id")?,
        )
    }

    /// Parses a DLPack device type and optional id.
    pub(crate) fn parse(device_type: i64, device_id: Option<i64>) -> PyResult<Self> {
        match device_type {
            KDLCPU => Ok(Target::Host),
            KDLCUDA => match device_id {
                None => Ok(Target::Cuda(None)),
                Some(id) => u32::try_from(id)
                    .map(|id| Target::Cuda(Some(id)))
                    .map_err(|_| PyValueError::new_err(format!("invalid device_id {id}"))),
            },
            KDLCUDAHOST | KDLCUDAMANAGED => Err(PyValueError::new_err(
                "kDLCUDAHost and kDLCUDAManaged are host memory kinds, chosen at construction \
                 with MemArray(..., host_memory='pinned' or 'managed'); move with kDLCPU",
            )),
            other => Err(PyValueError::new_err(format!(
                "unsupported device type {other}; memarray moves data to kDLCPU (1) or \
                 kDLCUDA (2)"
            ))),
        }
    }

    /// The location this target names for `raw`.
    pub(crate) fn resolve(self, raw: &RawArray) -> PyResult<Location> {
        Ok(match self {
            Target::Host => Location::Host,
            Target::Cuda(id) => Location::Device(id.unwrap_or(raw.device_id())),
            Target::Current => raw.location(),
        })
    }
}

/// The calling thread's current CUDA device (CUDA's current context, shared with torch,
/// CuPy and `cudaSetDevice`), the process default (`set_default_device`, 0 unless set)
/// when no context is current or there is no driver (then the first device use says
/// why): what `"cuda"` and an unset device mean.
pub(crate) fn current_cuda() -> u32 {
    memarray_cuda::current_or_default(false)
}

/// `(device_type, device_id)` of a location, as `__dlpack_device__` gives it.
pub(crate) fn location_tuple(loc: Location) -> (i64, i64) {
    match loc {
        Location::Host => (KDLCPU, 0),
        Location::Device(id) => (KDLCUDA, id as i64),
    }
}

/// "cpu" or "cuda:N".
pub(crate) fn device_name(loc: Location) -> String {
    match loc {
        Location::Host => "cpu".into(),
        Location::Device(id) => format!("cuda:{id}"),
    }
}

/// Parses a `device=` argument: "cpu", "cuda", "cuda:N", an int N (cuda:N), a DLPack
/// `(device_type, id)` pair, or an object with `type` and `index` (torch.device).
pub(crate) fn parse_device(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Location> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Location::Host);
    };
    let cuda = |id: i64| {
        u32::try_from(id)
            .map(Location::Device)
            .map_err(|_| PyValueError::new_err(format!("invalid CUDA device index {id}")))
    };
    if obj.is_instance_of::<pyo3::types::PyString>() {
        let s = crate::convert::text(obj, "device")?
            .trim()
            .to_ascii_lowercase();
        return match s.as_str() {
            "cpu" | "host" => Ok(Location::Host),
            "cuda" | "gpu" => Ok(Location::Device(current_cuda())),
            _ => match s.strip_prefix("cuda:").map(str::parse::<i64>) {
                Some(Ok(id)) => cuda(id),
                _ => Err(PyValueError::new_err(format!(
                    "unknown device {s:?}; use \"cpu\", \"cuda\", \"cuda:N\", an int N or \
                     (kDLCPU, 0) / (kDLCUDA, N)"
                ))),
            },
        };
    }
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err("device must not be a bool"));
    }
    if obj.is_instance_of::<pyo3::types::PyInt>() || obj.hasattr("__index__")? {
        return Ok(Location::Device(crate::convert::int(obj, "device")?));
    }
    if let Ok(pair) = obj.cast::<pyo3::types::PyTuple>()
        && pair.len() == 2
    {
        let ty: i64 = crate::convert::int(&pair.get_item(0)?, "device type")?;
        let id: i64 = crate::convert::int(&pair.get_item(1)?, "device id")?;
        return match ty {
            KDLCPU => Ok(Location::Host),
            KDLCUDA => cuda(id),
            other => Err(PyValueError::new_err(format!(
                "unsupported DLPack device type {other}; memarray arrays live on kDLCPU (1) \
                 or kDLCUDA (2)"
            ))),
        };
    }
    if let (Ok(ty), Ok(index)) = (obj.getattr("type"), obj.getattr("index")) {
        let ty: String = crate::convert::text(&ty, "device.type")?;
        let index = crate::convert::opt_int::<i64>(Some(&index), "device.index")?;
        return match (ty.as_str(), index) {
            ("cpu", _) => Ok(Location::Host),
            ("cuda", id) => id.map_or(Ok(Location::Device(current_cuda())), cuda),
            (other, _) => Err(PyValueError::new_err(format!(
                "unsupported device type {other:?}"
            ))),
        };
    }
    Err(PyTypeError::new_err(format!(
        "device must be a str, an int, a (device_type, id) pair or a torch.device, not {}",
        obj.get_type().name()?
    )))
}

/// A `device=` argument ("cpu", "cuda", "cuda:N", an int, a DLPack pair, a torch.device)
/// as the DLPack pair it names, parsed as `empty(device=...)` parses it.
#[pyfunction]
pub fn _device_pair(device: Option<&Bound<'_, PyAny>>) -> PyResult<(i64, i64)> {
    Ok(location_tuple(parse_device(device)?))
}

/// The device with ordinal `id`: ValueError for a negative id, CudaUnavailableError
/// without a driver, ValueError for an id beyond the device count.
pub(crate) fn device_of(id: Option<&Bound<'_, PyAny>>) -> PyResult<Arc<Device>> {
    let id: u32 = convert::opt_int(id, "device_id")?.unwrap_or(0);
    Device::get(id).py()
}
