//! [`FileResource`]: regions of a file as host-accessible memory (umem's `umemFile`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use memmap2::{MmapMut, MmapOptions};

use super::{Location, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// Granularity of file regions: mappings start at page-aligned offsets.
const PAGE: usize = 4096;

/// A file used as a storage device: each allocation is a page-aligned region of the file,
/// memory-mapped read-write (so the host reads and writes it like RAM, and the operating
/// system pages it to and from the file). Freed regions are reused by later allocations;
/// the file grows as needed and is never shrunk while the resource lives.
///
/// Alignments up to the page size (4096) are served. Copies in and out are ordinary host
/// copies ([`crate::HostBuffer`] over a file region reads like any host buffer), and the
/// CUDA layer copies to and from it like pageable memory.
///
/// ```
/// use memarray_core::{FileResource, MemoryKind, MemoryResource};
///
/// let path = std::env::temp_dir().join(format!("memarray-file-doc-{}", std::process::id()));
/// let file = FileResource::create(&path)?;
/// let p = file.allocate_zeroed(10_000, 64, None)?;
/// // SAFETY: p is a live, host-accessible allocation of 10,000 bytes.
/// unsafe { p.as_ptr().add(9_999).write(42) };
/// assert_eq!(file.kind(), MemoryKind::File);
/// assert!(file.file_len()? >= 10_000);
/// // SAFETY: p came from this resource with these arguments and is freed once.
/// unsafe { file.deallocate(p, 10_000, 64, None) };
/// # drop(file);
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct FileResource {
    path: PathBuf,
    name: String,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    file: File,
    /// End of the regions handed out so far (page-aligned).
    end: u64,
    /// Freed regions, `(offset, len)`, reused first-fit.
    free: Vec<(u64, u64)>,
    /// Live mappings by address: the mapping and its region.
    live: HashMap<usize, (MmapMut, u64, u64)>,
}

impl FileResource {
    /// Creates (or truncates) the file at `path` and uses it as storage.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        Ok(Self::with_file(path, file, 0))
    }

    /// Opens an existing file read-write and appends new regions after its current end,
    /// leaving its contents untouched.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        Ok(Self::with_file(
            path,
            file,
            len.next_multiple_of(PAGE as u64),
        ))
    }

    /// Opens an existing file read-only: it serves [`read_region`](Self::read_region);
    /// allocations fail (the file cannot grow).
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        Ok(Self::with_file(
            path,
            file,
            len.next_multiple_of(PAGE as u64),
        ))
    }

    /// Maps `len` bytes of the file from `offset` (any offset) read-only and runs `f` on
    /// them; the mapping ends when `f` returns. Past the end of the file is
    /// [`CoreError::CopyOutOfRange`].
    pub fn read_region<R>(&self, offset: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let st = self.lock();
        let file_len = st.file.metadata().map_err(|e| io_err(&self.path, e))?.len();
        let end = offset.checked_add(len as u64).filter(|&e| e <= file_len);
        if end.is_none() {
            return Err(CoreError::CopyOutOfRange {
                offset: usize::try_from(offset).unwrap_or(usize::MAX),
                len,
                capacity: usize::try_from(file_len).unwrap_or(usize::MAX),
            });
        }
        if len == 0 {
            return Ok(f(&[]));
        }
        let start = offset - offset % PAGE as u64;
        let skip = (offset - start) as usize;
        // SAFETY: a read-only private view of [start, start + skip + len), inside the file
        // (checked above); it is dropped before this returns. A concurrent truncation by
        // another process could fault the read, as with any mmap reader.
        let map = unsafe {
            MmapOptions::new()
                .offset(start)
                .len(skip + len)
                .map(&st.file)
        }
        .map_err(|e| io_err(&self.path, e))?;
        drop(st);
        Ok(f(&map[skip..skip + len]))
    }

    fn with_file(path: &Path, file: File, end: u64) -> Self {
        Self {
            name: format!("file {}", path.display()),
            path: path.to_path_buf(),
            state: Mutex::new(State {
                file,
                end,
                free: Vec::new(),
                live: HashMap::new(),
            }),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's current length in bytes.
    pub fn file_len(&self) -> Result<u64> {
        let st = self.lock();
        st.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| io_err(&self.path, e))
    }

    /// Writes every live region's dirty pages back to the file.
    pub fn flush(&self) -> Result<()> {
        let st = self.lock();
        for (m, _, _) in st.live.values() {
            m.flush().map_err(|e| io_err(&self.path, e))?;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Maps a region of at least `bytes` (0 allowed); returns the address and whether
    /// the region is fresh (so already zero).
    fn map(&self, bytes: usize, align: usize) -> Result<(NonNull<u8>, bool)> {
        if !align.is_power_of_two() || align > PAGE {
            return Err(CoreError::BadAlignment { align, max: PAGE });
        }
        let oom = |reason: String| CoreError::OutOfMemory {
            bytes,
            resource: self.name.clone(),
            reason,
        };
        let len = (bytes.max(1) as u64)
            .checked_next_multiple_of(PAGE as u64)
            .filter(|&l| l <= i64::MAX as u64 && usize::try_from(l).is_ok())
            .ok_or_else(|| oom("the size does not fit a file offset".into()))?;
        let mut st = self.lock();
        let (offset, fresh) = match st.free.iter().position(|&(_, l)| l >= len) {
            Some(i) => {
                let (off, l) = st.free.swap_remove(i);
                if l > len {
                    st.free.push((off + len, l - len));
                }
                (off, false)
            }
            None => {
                let off = st.end;
                let end = off
                    .checked_add(len)
                    .ok_or_else(|| oom("the file would pass 2^64 bytes".into()))?;
                // Growing the file is a sparse extension: no bytes are written.
                st.file
                    .set_len(end.max(st.file.metadata().map(|m| m.len()).unwrap_or(0)))
                    .map_err(|e| oom(format!("cannot grow {}: {e}", self.path.display())))?;
                st.end = end;
                (off, true)
            }
        };
        // SAFETY: the region [offset, offset + len) belongs to this resource alone (handed
        // out once, from `end` or the free list); the file is not truncated while mapped.
        // Other processes changing the file under the mapping is outside this contract.
        let map = unsafe {
            MmapOptions::new()
                .offset(offset)
                .len(len as usize)
                .map_mut(&st.file)
        };
        let mut map = match map {
            Ok(m) => m,
            Err(e) => {
                st.free.push((offset, len));
                return Err(oom(format!("mmap of {len} bytes failed: {e}")));
            }
        };
        let ptr = NonNull::new(map.as_mut_ptr()).ok_or_else(|| oom("mmap returned null".into()))?;
        st.live.insert(ptr.as_ptr() as usize, (map, offset, len));
        Ok((ptr, fresh))
    }
}

fn io_err(path: &Path, e: std::io::Error) -> CoreError {
    CoreError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

impl MemoryResource for FileResource {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        _stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.map(bytes, align).map(|(p, _)| p)
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        _stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        let (p, fresh) = self.map(bytes, align)?;
        if !fresh {
            // SAFETY: p maps at least `bytes` writable bytes, owned by the caller now.
            unsafe { p.as_ptr().write_bytes(0, bytes) };
        }
        Ok(p)
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        _bytes: usize,
        _align: usize,
        _stream: Option<RawStream>,
    ) {
        let mut st = self.lock();
        if let Some((map, offset, len)) = st.live.remove(&(ptr.as_ptr() as usize)) {
            drop(map);
            st.free.push((offset, len));
        }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::File
    }

    fn is_accessible_from(&self, location: Location) -> bool {
        location == Location::Host
    }

    fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_region_reads_any_offset_and_refuses_past_the_end() {
        let path = std::env::temp_dir().join(format!("memarray-region-{}", std::process::id()));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = FileResource::open_read_only(&path).unwrap();
        for (off, len) in [
            (0u64, 10_000usize),
            (4095, 7),
            (4096, 100),
            (9_999, 1),
            (123, 0),
        ] {
            let got = f.read_region(off, len, |b| b.to_vec()).unwrap();
            assert_eq!(got, &data[off as usize..off as usize + len], "{off} {len}");
        }
        assert!(f.read_region(9_999, 2, |_| ()).is_err());
        assert!(f.read_region(u64::MAX, 2, |_| ()).is_err());
        assert!(
            f.allocate(10, 8, None).is_err(),
            "a read-only file cannot grow"
        );
        std::fs::remove_file(&path).ok();
    }
}
