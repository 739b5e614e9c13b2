//! `.npy` files in and out of arrays: [`RawArray::load_npy`] and
//! [`RawArray::save_npy`]. Loading opens the file as a [`FileResource`] and reads the data
//! region with positional reads (`pread`, several threads) straight into the array's host
//! buffer, or straight into the staging pipeline's pinned slots on their way to a
//! device-born array (which gets no host buffer).
//! No mapping is read: a file truncated meanwhile is an error, never SIGBUS.
//! Saving writes the current data, read back from the device when it is there. Both
//! refuse anything but a regular file (a FIFO would block them beyond Ctrl-C's reach) and a
//! file a memarray `File` resource maps.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use memarray_core::npy::{parse_header, write_header};
use memarray_core::{CoreError, FileMode, FileResource, Location, LockToken, open_regular};

use crate::copy;

/// Bytes one thread reads per `pread` when loading: large enough that the call is cheap,
/// small enough that a piece spreads over the staging threads.
const READ_PIECE: usize = 8 << 20;
/// Bytes written per call when saving host data (the progress counter's step).
const WRITE_PIECE: usize = 64 << 20;
/// Most threads reading into a host buffer.
const READ_THREADS: usize = 8;

/// The largest header read: version 2/3 headers may be longer than version 1's 64 KiB,
/// but no writer makes them so.
const HEADER_MAX: u64 = 1 << 20;

use super::host_kind::HostKind;
use super::raw::RawArray;
use crate::error::Result;

pub(super) fn io(path: &Path, e: std::io::Error) -> CoreError {
    CoreError::io(path, &e)
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
    /// [`HostKind::auto`] unless given), as `np.load` reads it: Fortran-order and
    /// big-endian files come in C order and native byte order. Errors: `Io` (missing or
    /// unreadable file; `NotFound` for a missing one), `BadNpy` (a header NumPy refuses, a
    /// dtype memarray does not hold, less data than the header says).
    pub fn load_npy(
        path: impl AsRef<Path>,
        location: Location,
        host_kind: Option<HostKind>,
    ) -> Result<Self> {
        Self::load_npy_counted(path, location, host_kind, &AtomicU64::new(0))
    }

    /// [`RawArray::load_npy`], adding the data bytes read so far to `done` as it goes (a
    /// front end's progress bar reads it from another thread).
    pub fn load_npy_counted(
        path: impl AsRef<Path>,
        location: Location,
        host_kind: Option<HostKind>,
        done: &AtomicU64,
    ) -> Result<Self> {
        let path = path.as_ref();
        let file = FileResource::open_read_only(path)?;
        let file_len = file.file_len()?;
        // The header is at most a few KiB (64 KiB for version 1); read what the file has.
        let mut head = vec![0u8; file_len.min(HEADER_MAX) as usize];
        file.read_into(0, &mut head)?;
        let h = parse_header(&head).map_err(|e| named(path, e))?;
        let available = file_len.saturating_sub(h.data_offset as u64);
        if (h.nbytes as u64) > available {
            return Err(CoreError::BadNpy {
                path: path.display().to_string(),
                reason: format!(
                    "the header describes {} bytes of data but the file holds {available}",
                    h.nbytes
                ),
            }
            .into());
        }
        let mut a = RawArray::empty_on(h.dtype, &h.shape, location, host_kind, None)?;
        let start = h.data_offset as u64;
        if h.needs_conversion() {
            // Fortran order or big-endian: read as the file holds it, then reorder.
            let mut raw = vec![0u8; h.nbytes];
            read_parallel(&file, start, &mut raw, done)?;
            match location {
                Location::Host => h.to_c_native(&raw, a.host_bytes_mut(None)?),
                Location::Device(_) => {
                    let mut native = vec![0u8; h.nbytes];
                    h.to_c_native(&raw, &mut native);
                    drop(raw);
                    a.dev.write_with(0, h.nbytes, &|off, buf| {
                        buf.copy_from_slice(&native[off..off + buf.len()]);
                        Ok(())
                    })?;
                }
            }
            return Ok(a);
        }
        match location {
            Location::Host => read_parallel(&file, start, a.host_bytes_mut(None)?, done)?,
            Location::Device(_) => a.dev.write_with(0, h.nbytes, &|off, buf| {
                file.read_into(start + off as u64, buf)?;
                done.fetch_add(buf.len() as u64, Ordering::Relaxed);
                Ok(())
            })?,
        }
        Ok(a)
    }

    /// Writes the current data to `path` as a `.npy` file (version 1.0, C order), readable
    /// by `numpy.load`. bfloat16 has no NumPy dtype and is refused.
    pub fn save_npy(&self, path: impl AsRef<Path>, token: Option<LockToken>) -> Result<()> {
        self.save_npy_counted(path, token, &AtomicU64::new(0))
    }

    /// [`RawArray::save_npy`], adding the data bytes written so far to `done`.
    pub fn save_npy_counted(
        &self,
        path: impl AsRef<Path>,
        token: Option<LockToken>,
        done: &AtomicU64,
    ) -> Result<()> {
        let path = path.as_ref();
        self.check(token)?;
        let header = write_header(self.dtype, &self.shape)?;
        let mut f = std::io::BufWriter::new(open_regular(path, FileMode::Truncate)?);
        f.write_all(&header).map_err(|e| io(path, e))?;
        self.write_data(&mut f, path, done)?;
        f.flush().map_err(|e| io(path, e))?;
        Ok(())
    }

    /// Writes the current data to `f` (the file at `path`, for messages), C order: host
    /// data in pieces, device data read back in 64 MiB pieces (bounded host memory for any
    /// size); adds the bytes written to `done`.
    pub(super) fn write_data(
        &self,
        f: &mut impl Write,
        path: &Path,
        done: &AtomicU64,
    ) -> Result<()> {
        match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                // In pieces, so `done` moves as the file grows.
                for piece in self.host_buf()?.as_slice().chunks(WRITE_PIECE) {
                    f.write_all(piece).map_err(|e| io(path, e))?;
                    done.fetch_add(piece.len() as u64, Ordering::Relaxed);
                }
            }
            Location::Device(_) => {
                const PIECE: usize = 64 << 20;
                let mut piece = vec![0u8; PIECE.min(self.nbytes)];
                let mut off = 0;
                while off < self.nbytes {
                    let n = PIECE.min(self.nbytes - off);
                    self.dev.read_bytes(off, &mut piece[..n])?;
                    f.write_all(&piece[..n]).map_err(|e| io(path, e))?;
                    done.fetch_add(n as u64, Ordering::Relaxed);
                    off += n;
                }
            }
        }
        Ok(())
    }
}

/// Fills `dst` from `file` at `offset`, `READ_PIECE` bytes per read, on the staging
/// threads, adding each piece's bytes to `done`.
pub(super) fn read_parallel(
    file: &FileResource,
    offset: u64,
    dst: &mut [u8],
    done: &AtomicU64,
) -> Result<()> {
    let pieces = dst.len().div_ceil(READ_PIECE);
    if pieces <= 1 {
        file.read_into(offset, dst)?;
        done.fetch_add(dst.len() as u64, Ordering::Relaxed);
        return Ok(());
    }
    let base = dst.as_mut_ptr() as usize;
    let len = dst.len();
    let threads = pieces.min(copy::MAX_THREADS).min(READ_THREADS);
    copy::parallel(threads, &|t| {
        for k in (t..pieces).step_by(threads) {
            let at = k * READ_PIECE;
            let n = READ_PIECE.min(len - at);
            // SAFETY: pieces [at, at + n) are disjoint across (t, k) and inside `dst`,
            // which is exclusively borrowed until `parallel` returns (it waits for all).
            let piece = unsafe { std::slice::from_raw_parts_mut((base + at) as *mut u8, n) };
            file.read_into(offset + at as u64, piece)?;
            done.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(())
    })
}
