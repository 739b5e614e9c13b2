//! [`UniqueId`]: the id every rank of one communicator shares, and the ways to pass it.

use std::path::Path;
use std::time::{Duration, Instant};

use cudarc::nccl::sys::ncclUniqueId;

use super::{NcclError, Result, UNIQUE_ID_BYTES, lib};

/// The id every rank of one communicator shares: made by one rank ([`UniqueId::new`]),
/// passed to the others by any channel (bytes, hex, a file).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}..)", &self.to_hex()[..16])
    }
}

impl UniqueId {
    /// A new id (`ncclGetUniqueId`: it also starts the bootstrap listener rank 0 uses).
    pub fn new() -> Result<Self> {
        let lib = lib::load(None)?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: the out pointer is valid.
        let r = unsafe { (lib.get_unique_id)(&mut id) };
        lib.check("ncclGetUniqueId", r, std::ptr::null_mut())?;
        Ok(Self(id.internal.map(|c| c as u8)))
    }

    /// The 128 bytes.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        self.0
    }

    /// An id from its 128 bytes; any other length is an error.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let arr: [u8; UNIQUE_ID_BYTES] = b.try_into().map_err(|_| NcclError::Call {
            call: "UniqueId::from_bytes",
            reason: format!("a unique id is {UNIQUE_ID_BYTES} bytes, got {}", b.len()),
        })?;
        Ok(Self(arr))
    }

    /// 256 lowercase hex digits (for an environment variable).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The inverse of [`to_hex`](Self::to_hex).
    pub fn from_hex(s: &str) -> Result<Self> {
        let s = s.trim();
        let bad = || NcclError::Call {
            call: "UniqueId::from_hex",
            reason: format!(
                "a unique id is {} hex digits, got {:?}",
                2 * UNIQUE_ID_BYTES,
                s.chars().take(40).collect::<String>()
            ),
        };
        if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
            return Err(bad());
        }
        let mut out = [0u8; UNIQUE_ID_BYTES];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(out))
    }

    /// Shares an id through a file every rank can read: rank 0 makes one and writes it
    /// (atomically: a temporary file renamed into place), the others wait up to `timeout`
    /// for it. Use a fresh path per run (a stale file from an earlier run would hand the
    /// other ranks a dead id).
    pub fn exchange_file(path: &Path, rank: usize, timeout: Duration) -> Result<Self> {
        let io = |what: &str, e: std::io::Error| NcclError::Call {
            call: "UniqueId::exchange_file",
            reason: format!("{what} {}: {e}", path.display()),
        };
        if rank == 0 {
            let id = Self::new()?;
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, id.to_hex()).map_err(|e| io("cannot write", e))?;
            std::fs::rename(&tmp, path).map_err(|e| io("cannot rename into", e))?;
            return Ok(id);
        }
        let start = Instant::now();
        loop {
            match std::fs::read_to_string(path) {
                Ok(s) => return Self::from_hex(&s),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if start.elapsed() > timeout {
                        return Err(NcclError::Call {
                            call: "UniqueId::exchange_file",
                            reason: format!(
                                "rank {rank} waited {timeout:?} for rank 0 to write {}",
                                path.display()
                            ),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io("cannot read", e)),
            }
        }
    }

    pub(super) fn raw(&self) -> ncclUniqueId {
        ncclUniqueId {
            internal: self.0.map(|b| b as std::ffi::c_char),
        }
    }
}
