//! `.npy` files in and out of arrays (issue 7): [`RawArray::load_npy`] and
//! [`RawArray::save_npy`]. Loading maps the file and copies its data straight to where the
//! array is born (a device-born array gets no host buffer); saving writes the current
//! data, read back from the device when it is there.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use memarray_core::npy::{parse_header, write_header};
use memarray_core::{CoreError, Location, LockToken};

use super::host_kind::HostKind;
use super::raw::RawArray;
use crate::error::Result;

fn io(path: &Path, e: std::io::Error) -> CoreError {
    CoreError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

fn named(path: &Path, e: CoreError) -> CoreError {
    match e {
        CoreError::BadNpy { reason, .. } => CoreError::BadNpy {
            path: path.display().to_string(),
            reason,
        },
        other => other,
    }
}

impl RawArray {
    /// Reads the `.npy` file at `path` into a new array at `location` (its host kind
    /// [`HostKind::auto`] unless given). Errors: `Io` (missing or unreadable file),
    /// `BadNpy` (bad header, unsupported dtype or order, less data than the header says).
    pub fn load_npy(
        path: impl AsRef<Path>,
        location: Location,
        host_kind: Option<HostKind>,
    ) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io(path, e))?;
        // SAFETY: the map is read only while this function runs; a concurrent writer
        // truncating the file could fault the read (as with any mmap reader), which this
        // API accepts in exchange for copying straight from the page cache.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io(path, e))?;
        let h = parse_header(&map).map_err(|e| named(path, e))?;
        let end = h
            .data_offset
            .checked_add(h.nbytes)
            .filter(|&e| e <= map.len());
        let Some(end) = end else {
            return Err(CoreError::BadNpy {
                path: path.display().to_string(),
                reason: format!(
                    "the header describes {} bytes of data but the file holds {}",
                    h.nbytes,
                    map.len().saturating_sub(h.data_offset)
                ),
            }
            .into());
        };
        let data = &map[h.data_offset..end];
        let mut a = RawArray::empty_on(h.dtype, &h.shape, location, host_kind, None)?;
        match location {
            Location::Host => a.host_bytes_mut(None)?.copy_from_slice(data),
            Location::Device(_) => a.dev.write_bytes(0, data)?,
        }
        Ok(a)
    }

    /// Writes the current data to `path` as a `.npy` file (version 1.0, C order), readable
    /// by `numpy.load`. bfloat16 has no NumPy dtype and is refused.
    pub fn save_npy(&self, path: impl AsRef<Path>, token: Option<LockToken>) -> Result<()> {
        let path = path.as_ref();
        self.check(token)?;
        let header = write_header(self.dtype, &self.shape)?;
        let mut f = std::io::BufWriter::new(File::create(path).map_err(|e| io(path, e))?);
        f.write_all(&header).map_err(|e| io(path, e))?;
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                f.write_all(self.host_buf()?.as_slice())
                    .map_err(|e| io(path, e))?;
            }
            Location::Device(_) => {
                // In 64 MiB pieces: bounded host memory for any size.
                const PIECE: usize = 64 << 20;
                let mut piece = vec![0u8; PIECE.min(self.nbytes)];
                let mut off = 0;
                while off < self.nbytes {
                    let n = PIECE.min(self.nbytes - off);
                    self.dev.read_bytes(off, &mut piece[..n])?;
                    f.write_all(&piece[..n]).map_err(|e| io(path, e))?;
                    off += n;
                }
            }
        }
        f.flush().map_err(|e| io(path, e))?;
        Ok(())
    }
}
