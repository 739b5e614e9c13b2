//! [`CudaError`]: everything memarray-cuda can refuse, with the numbers and the fix.

use memarray_core::{CoreError, ErrorKind, Location};
use thiserror::Error;

/// Errors of the CUDA layer. Each variant names the values involved and, where there is
/// one, the fix. Python maps [`CudaError::Unavailable`] to `memarray.CudaUnavailableError`
/// and [`CudaError::Core`] as core errors map. Out of memory has one form in every layer,
/// `CoreError::OutOfMemory` (here inside [`CudaError::Core`]); [`CudaError::is_out_of_memory`]
/// also recognises a driver call that failed with `CUDA_ERROR_OUT_OF_MEMORY`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// No usable CUDA driver or device: libcuda is missing, or `cuInit` failed.
    #[error(
        "CUDA is unavailable: {reason}. CPU features keep working; GPU work needs an NVIDIA \
         driver and a visible device (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    )]
    Unavailable {
        /// Why, in words (the driver's error name where there is one).
        reason: String,
    },
    /// A driver call returned an error.
    #[error("{call} failed with {name} ({code}): {message}")]
    Driver {
        /// The driver entry point, e.g. `"cuMemcpyHtoDAsync_v2"`.
        call: &'static str,
        /// The `CUresult` value.
        code: i32,
        /// `cuGetErrorName`, e.g. `"CUDA_ERROR_INVALID_VALUE"`.
        name: String,
        /// `cuGetErrorString`, plus a hint where memarray knows one.
        message: String,
    },
    /// A device ordinal past the number of devices.
    #[error(
        "no CUDA device {id}: this process sees {count} device(s){}; check CUDA_VISIBLE_DEVICES",
        if *.count > 0 { format!(", ids 0..={}", .count - 1) } else { String::new() }
    )]
    NoSuchDevice {
        /// The ordinal asked for.
        id: u32,
        /// Devices visible to this process.
        count: u32,
    },
    /// Two operands live on different devices where one device is required.
    #[error(
        "{what} needs cuda:{expected} but got cuda:{got}; copy between devices with copy::copy_peer"
    )]
    WrongDevice {
        /// The operation, in words.
        what: &'static str,
        /// The device the operation runs on.
        expected: u32,
        /// The device of the other operand.
        got: u32,
    },
    /// Stream handle 0 was given.
    #[error(
        "stream handle 0 is refused: libraries disagree whether it means the legacy or the \
         per-thread default stream; pass 1 (StreamRef::legacy) or 2 (StreamRef::per_thread)"
    )]
    NullStream,
    /// A driver call that failed where nothing could return its error (a `Drop` or a free
    /// path), reported later by [`crate::parked::check`].
    #[error(
        "an earlier error memarray could not report at the time: {during} failed: {source}{}",
        if *.others > 0 { format!(" (and {} more)", .others) } else { String::new() }
    )]
    Parked {
        /// What memarray was doing, e.g. "freeing device memory".
        during: &'static str,
        /// The error the call returned.
        source: Box<CudaError>,
        /// Further errors parked with it and reported only by this count.
        others: usize,
    },
    /// A buffer smaller than the data an operation covers.
    #[error("{what} covers {needed} bytes but the buffer holds {len} bytes")]
    BufferTooSmall {
        /// The operation, in words.
        what: String,
        /// Bytes the operation covers.
        needed: usize,
        /// Bytes in the buffer.
        len: usize,
    },
    /// A memory resource whose memory the device cannot reach.
    #[error(
        "memory resource {resource:?} is not accessible from {location}; use a device, \
         async-pool, managed or pinned resource"
    )]
    Inaccessible {
        /// The resource's name.
        resource: String,
        /// Where the memory was needed.
        location: Location,
    },
    /// An argument outside what the operation accepts (a partition that does not fit, a
    /// reduction a dtype has no form of, a stream handle that is not a stream).
    #[error("{what}: {detail}")]
    InvalidArgument {
        /// The operation or argument.
        what: &'static str,
        /// What is wrong and what is accepted.
        detail: String,
    },
    /// Work that cannot be captured into a CUDA graph, asked of a stream being captured
    /// (a host wait, host threads reading pageable memory, a spill). Refused before
    /// anything was enqueued: the capture stays valid.
    #[error(
        "{what} cannot be captured into a CUDA graph: stream {stream:#x} is being captured \
         (capture {id}); do it before the capture begins or after it ends (the capture is \
         still valid)"
    )]
    Captured {
        /// The refused operation.
        what: &'static str,
        /// The stream's handle.
        stream: usize,
        /// The driver's id of the capture.
        id: u64,
    },
    /// A graph launch refused because an array the graph uses no longer has its device
    /// data where the capture recorded it (it moved, was spilled or went to the host): a
    /// launch would read or write memory that is not the array's. Nothing was launched.
    #[error(
        "a graph uses an array whose device data moved since the capture (it was at \
         {captured:#x} on device {device}, it is at {now:#x}): capture the work again \
         (nothing was launched)"
    )]
    GraphArrayMoved {
        /// The device the capture used the array on.
        device: u32,
        /// The array's device address when it was captured.
        captured: u64,
        /// Its device address now.
        now: u64,
    },
    /// A setting memarray was given (a call or an environment variable) that it refuses.
    #[error(transparent)]
    Setting(#[from] SettingError),
    /// A kernel that cannot be compiled, loaded or launched as asked.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Device memory that cannot be shared with another process, or an IPC handle that
    /// cannot be opened here.
    #[error(transparent)]
    Ipc(#[from] IpcError),
    /// An error of the MemArray mirror (where the data is against what an operation
    /// needs).
    #[error(transparent)]
    Array(#[from] ArrayError),
    /// An error from memarray-core (shapes, bounds, allocation).
    #[error(transparent)]
    Core(#[from] CoreError),
}

/// A setting memarray refuses: staging and spill settings from a call, or an environment
/// variable it does not understand. Nothing changes when one is refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettingError {
    /// An environment variable with a value memarray does not understand.
    #[error("environment variable {var}={value:?} is not understood; expected {expected}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The accepted values, in words.
        expected: &'static str,
    },
    /// A setting outside its accepted range.
    #[error("{what}: {detail}")]
    Invalid {
        /// The setting.
        what: &'static str,
        /// What is wrong and what is accepted.
        detail: String,
    },
}

impl SettingError {
    /// A value given in a call is the caller's argument; a variable the environment
    /// holds is a failure of the run's setup.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SettingError::Env { .. } => ErrorKind::Failed,
            SettingError::Invalid { .. } => ErrorKind::InvalidArgument,
        }
    }
}

/// A kernel that cannot be compiled, loaded or launched as asked (the seed kernel's
/// module, users' PTX, cubins, CUDA source, their arguments and launch shapes). Each is
/// the caller's input refused, with the driver's or NVRTC's words.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LaunchError {
    /// An image the driver refuses (bad PTX, another architecture's cubin), or none.
    #[error("kernel module: {detail}")]
    Module {
        /// What is wrong, with the driver's error.
        detail: String,
    },
    /// A kernel name the module does not hold.
    #[error("kernel name: {detail}")]
    Kernel {
        /// Which name, and the driver's answer.
        detail: String,
    },
    /// Arguments that do not match the kernel's parameters.
    #[error("kernel arguments: {detail}")]
    Arguments {
        /// Which argument and why.
        detail: String,
    },
    /// A grid or block the launch cannot take.
    #[error("launch configuration: {detail}")]
    Configuration {
        /// The grid and block, and the limits.
        detail: String,
    },
    /// CUDA source NVRTC cannot compile (the log), or text it cannot take.
    #[error("{what}: {detail}")]
    Compile {
        /// NVRTC, the source or its name.
        what: &'static str,
        /// What failed, with NVRTC's log.
        detail: String,
    },
}

/// CUDA IPC refused: memory that cannot be shared, a handle that is not one, or one that
/// cannot be opened in this process.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpcError {
    /// Bytes that are not a memarray IPC handle.
    #[error("CUDA IPC: {reason}")]
    Handle {
        /// What is wrong with them.
        reason: String,
    },
    /// Data that cannot be shared with another process (on the host, or from memory
    /// CUDA cannot export).
    #[error("CUDA IPC: {reason}")]
    Export {
        /// Why, with the fix.
        reason: String,
    },
    /// A handle that cannot be opened here (this process made it, its exporter is gone,
    /// it claims more than the allocation holds).
    #[error("CUDA IPC: {reason}")]
    Open {
        /// Why, with the driver's answer.
        reason: String,
    },
}

/// Errors of the MemArray mirror (`memarray_cuda::array`), apart from driver and device
/// errors: the data is not where an operation needs it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArrayError {
    /// Host access to an array whose current data is on a device.
    #[error(
        "the array's data is on {location}, not on the host; move it to the host first \
         (move_memory(Location::Host, ..))"
    )]
    NotOnHost {
        /// Where the data is.
        location: Location,
    },
    /// An operation on one device given an array whose data is elsewhere.
    #[error(
        "{what} needs the array's data on cuda:{expected}, but it is on {location}; move it \
         there first (move_memory)"
    )]
    NotOnDevice {
        /// The operation, in words.
        what: &'static str,
        /// The device the operation runs on.
        expected: u32,
        /// Where the array's data is.
        location: Location,
    },
    /// Device access to an array that has no device copy yet.
    #[error(
        "the array has no device copy; move it to a device first (move_memory(Location::Device(id), ..))"
    )]
    NoDeviceCopy,
    /// Host access to an array born on a device that has no host copy yet (an internal
    /// invariant: every path to the host makes one first).
    #[error(
        "the array has no host copy yet; move it to the host first (move_memory(Location::Host, ..))"
    )]
    NoHostCopy,
    /// A raw device address of a spilled array, asked through a shared reference that
    /// cannot restore it.
    #[error(
        "the array is spilled to the host for now; restore it first (RawArray::restore, or \
         any operation through a mutable reference or a SharedArray restores it)"
    )]
    Spilled,
    /// A foreign tensor that cannot be shared zero-copy, imported with copies forbidden.
    #[error(
        "the tensor cannot be shared zero-copy ({reason}) and a copy was forbidden \
         (copy=False); allow a copy (copy=None or copy=True)"
    )]
    NotShareable {
        /// Why, in words ("it is read-only", "it is not C-contiguous").
        reason: &'static str,
    },
    /// A foreign device tensor whose memory the driver does not know, or that reaches
    /// past the end of its allocation.
    #[error("refused foreign device tensor: {reason}")]
    ForeignMemory {
        /// The driver's answer, with the numbers.
        reason: String,
    },
    /// A spill asked for by name ([`crate::array::SharedArray::evict`]) that cannot happen now.
    #[error("the array cannot be spilled now: {reason}")]
    NotSpillable {
        /// Why, in words.
        reason: &'static str,
    },
}

impl ArrayError {
    /// What kind of failure this is: the data is not where the call needs it, a foreign
    /// tensor the caller cannot import so (their argument), or (not spillable now) the
    /// call failed.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ArrayError::NotSpillable { .. } => ErrorKind::Failed,
            ArrayError::NotShareable { .. } | ArrayError::ForeignMemory { .. } => {
                ErrorKind::InvalidArgument
            }
            _ => ErrorKind::WrongLocation,
        }
    }
}

impl CudaError {
    /// What kind of failure this is, for the language boundaries (a driver's
    /// out-of-memory is [`ErrorKind::OutOfMemory`], as the core's is).
    pub fn kind(&self) -> ErrorKind {
        if self.is_out_of_memory() {
            return ErrorKind::OutOfMemory;
        }
        match self {
            CudaError::Parked { source, .. } => source.kind(),
            CudaError::Core(c) => c.kind(),
            CudaError::Array(a) => a.kind(),
            CudaError::Unavailable { .. } => ErrorKind::Unavailable,
            CudaError::Driver { .. } => ErrorKind::Driver,
            CudaError::Setting(e) => e.kind(),
            // The caller's kernel, arguments or launch shape.
            CudaError::Launch(_) => ErrorKind::InvalidArgument,
            // A resource or device the caller named that cannot serve: their argument.
            CudaError::InvalidArgument { .. }
            | CudaError::NoSuchDevice { .. }
            | CudaError::Inaccessible { .. } => ErrorKind::InvalidArgument,
            _ => ErrorKind::Failed,
        }
    }

    /// Whether this is an out-of-memory error: from the driver, this layer, or a resource
    /// (a core `OutOfMemory` a resource reported).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            CudaError::Driver { code, .. } => *code == OUT_OF_MEMORY_CODE,
            CudaError::Core(c) => c.is_out_of_memory(),
            _ => false,
        }
    }

    /// A driver out-of-memory error restated as the one out-of-memory error
    /// (`CoreError::OutOfMemory`) naming the bytes, the device and the fix; other errors
    /// unchanged.
    pub(crate) fn with_oom_context(self, bytes: usize, device: u32) -> CudaError {
        if self.is_out_of_memory() {
            CudaError::Core(CoreError::OutOfMemory {
                bytes,
                resource: format!("cuda:{device}"),
                reason: format!(
                    "out of memory on cuda:{device}; free arrays you no longer need, allocate \
                     less, or use a stream-ordered pool that can reuse freed memory"
                ),
            })
        } else {
            self
        }
    }

    /// This error as a core allocation error, for [`memarray_core::MemoryResource`]
    /// implementations, whose methods return [`CoreError`].
    pub(crate) fn into_alloc(self, bytes: usize, align: usize, resource: &str) -> CoreError {
        match self {
            CudaError::Core(CoreError::OutOfMemory { reason, .. }) => CoreError::OutOfMemory {
                bytes,
                resource: resource.to_string(),
                reason,
            },
            CudaError::Core(e) => e,
            e if e.is_out_of_memory() => CoreError::OutOfMemory {
                bytes,
                resource: resource.to_string(),
                reason: e.to_string(),
            },
            // No driver, or a forked child: not an allocation failure (never MemoryError).
            CudaError::Unavailable { reason } => CoreError::Unavailable {
                resource: resource.to_string(),
                reason,
            },
            other => CoreError::Alloc {
                bytes,
                align,
                resource: resource.to_string(),
                reason: other.to_string(),
            },
        }
    }
}

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) const OUT_OF_MEMORY_CODE: i32 = 2;

/// Result alias for the CUDA layer.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unusable_driver_under_a_resource_is_unavailable_not_out_of_memory() {
        let e = CudaError::Unavailable {
            reason: "forked".into(),
        }
        .into_alloc(512, 256, "cuda:0 device");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(!e.is_out_of_memory());
        assert!(e.to_string().contains("forked"));
    }

    #[test]
    fn one_classification_for_every_boundary() {
        let driver = |code| CudaError::Driver {
            call: "cuMemAlloc_v2",
            code,
            name: "X".into(),
            message: "x".into(),
        };
        // A driver's out-of-memory is the same kind as a resource's.
        assert_eq!(driver(OUT_OF_MEMORY_CODE).kind(), ErrorKind::OutOfMemory);
        assert_eq!(driver(1).kind(), ErrorKind::Driver);
        let cases = [
            (
                CudaError::NoSuchDevice { id: 3, count: 1 },
                ErrorKind::InvalidArgument,
            ),
            (
                CudaError::Unavailable {
                    reason: "no driver".into(),
                },
                ErrorKind::Unavailable,
            ),
            (
                CudaError::Array(ArrayError::NoHostCopy),
                ErrorKind::WrongLocation,
            ),
            (
                CudaError::Array(ArrayError::NotSpillable { reason: "locked" }),
                ErrorKind::Failed,
            ),
            (
                CudaError::Core(CoreError::Locked {
                    held: 1,
                    requested: Some(2),
                }),
                ErrorKind::Locked,
            ),
            (
                CudaError::Core(CoreError::UnsupportedDType { what: "x".into() }),
                ErrorKind::Dtype,
            ),
            (CudaError::NullStream, ErrorKind::Failed),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind(), kind, "{e}");
        }
    }

    #[test]
    fn messages_name_numbers_and_fixes() {
        let e = CudaError::NoSuchDevice { id: 3, count: 2 };
        assert_eq!(
            e.to_string(),
            "no CUDA device 3: this process sees 2 device(s), ids 0..=1; check CUDA_VISIBLE_DEVICES"
        );
        let e = CudaError::NoSuchDevice { id: 0, count: 0 };
        assert!(e.to_string().contains("sees 0 device(s);"), "{e}");
        let e = CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: OUT_OF_MEMORY_CODE,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            message: "out of memory".into(),
        }
        .with_oom_context(1 << 40, 1);
        assert!(e.to_string().contains("1099511627776 bytes"), "{e}");
        assert!(e.to_string().contains("cuda:1"), "{e}");
        assert!(matches!(e, CudaError::Core(CoreError::OutOfMemory { .. })));
        assert!(e.is_out_of_memory());
        let core = CoreError::OutOfMemory {
            bytes: 8,
            resource: "pool".into(),
            reason: "full".into(),
        };
        assert!(core.is_out_of_memory());
        assert!(
            CudaError::Core(core).is_out_of_memory(),
            "one OOM, recognised by every layer"
        );
        assert!(!CudaError::Array(ArrayError::NoDeviceCopy).is_out_of_memory());
        assert!(
            CudaError::NullStream
                .to_string()
                .contains("StreamRef::legacy")
        );
    }

    #[test]
    fn oom_becomes_a_core_out_of_memory_error_naming_bytes_and_device() {
        let e = CudaError::Driver {
            call: "cuMemAlloc_v2",
            code: OUT_OF_MEMORY_CODE,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
            message: "out of memory".into(),
        }
        .with_oom_context(4096, 0)
        .into_alloc(4096, 256, "cuda:0 device");
        match &e {
            CoreError::OutOfMemory {
                bytes,
                resource,
                reason,
            } => {
                assert_eq!(*bytes, 4096);
                assert_eq!(resource, "cuda:0 device");
                assert!(reason.contains("cuda:0"), "{reason}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        let core = CoreError::BadAlignment { align: 3, max: 256 };
        assert_eq!(CudaError::Core(core.clone()).into_alloc(1, 3, "x"), core);
    }
}
