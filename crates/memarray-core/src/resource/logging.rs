//! [`LoggingAdaptor`]: one CSV row per allocation and free.

use std::io::Write;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Location, MemoryInfo, MemoryKind, MemoryResource, RawStream};
use crate::error::{CoreError, Result};

/// The CSV header [`LoggingAdaptor`] writes first.
pub const LOG_HEADER: &str = "time,event,device,address,size,stream,source";

/// Wraps a resource and logs every call as a CSV row (RMM's `logging_resource_adaptor`):
/// `time` (seconds since the Unix epoch, ns resolution), `event` (`allocate`, `free`,
/// `allocate_failed`; `spill` and `restore` for arrays spilled from and restored to the
/// device, written before the next row, no address), `device` (an id, or `host`), `address` (hex), `size` (bytes),
/// `stream` (the handle, empty for none), `source` (the wrapped resource's name).
///
/// Rows are buffered; [`flush`](Self::flush) or dropping the adaptor writes them out. A
/// failing writer never fails an allocation: failed writes are counted
/// ([`write_errors`](Self::write_errors)), and the next [`flush`](Self::flush) reports
/// them as [`CoreError::Io`] (a full disk never drops rows silently).
///
/// ```
/// use std::sync::Arc;
/// use memarray_core::{HostResource, LoggingAdaptor, MemoryResource};
///
/// let path = std::env::temp_dir().join(format!("memarray-log-doc-{}.csv", std::process::id()));
/// let log = LoggingAdaptor::to_path(Arc::new(HostResource), &path)?;
/// let p = log.allocate(256, 64, None)?;
/// // SAFETY: p came from this resource with these arguments and is freed once.
/// unsafe { log.deallocate(p, 256, 64, None) };
/// log.flush()?;
/// let text = std::fs::read_to_string(&path).unwrap();
/// let rows: Vec<&str> = text.lines().collect();
/// assert_eq!(rows[0], "time,event,device,address,size,stream,source");
/// assert!(rows[1].contains(",allocate,host,") && rows[2].contains(",free,host,"));
/// # std::fs::remove_file(&path).ok();
/// # Ok::<(), memarray_core::CoreError>(())
/// ```
#[derive(Debug)]
pub struct LoggingAdaptor {
    upstream: Arc<dyn MemoryResource>,
    out: Mutex<Writer>,
    write_errors: AtomicU64,
    /// Failed writes already reported by `flush`.
    reported: AtomicU64,
    target: String,
    name: String,
    source: String,
    /// The last memory event written (spills and restores, [`super::events`]).
    events_seen: AtomicU64,
}

struct Writer(std::io::BufWriter<Box<dyn Write + Send>>);

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer")
    }
}

impl LoggingAdaptor {
    /// Logs `upstream`'s calls to `out`, starting with [`LOG_HEADER`].
    pub fn new(upstream: Arc<dyn MemoryResource>, out: Box<dyn Write + Send>) -> Self {
        Self::with_target(upstream, out, "the log writer".into())
    }

    fn with_target(
        upstream: Arc<dyn MemoryResource>,
        out: Box<dyn Write + Send>,
        target: String,
    ) -> Self {
        let name = super::adaptor_name("logging", upstream.name());
        let this = Self {
            reported: AtomicU64::new(0),
            target,
            // The upstream's name, as bounded in `name`.
            source: csv_field(&name["logging(".len()..name.len() - 1]),
            name,
            upstream,
            out: Mutex::new(Writer(std::io::BufWriter::new(out))),
            write_errors: AtomicU64::new(0),
            events_seen: AtomicU64::new(super::events::last_event()),
        };
        this.write(format_args!("{LOG_HEADER}\n"));
        this
    }

    /// Logs to a new file at `path` (truncated if it exists).
    pub fn to_path(upstream: Arc<dyn MemoryResource>, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let f = std::fs::File::create(path).map_err(|e| CoreError::io(path, &e))?;
        Ok(Self::with_target(
            upstream,
            Box::new(f),
            path.display().to_string(),
        ))
    }

    /// Writes buffered rows out. [`CoreError::Io`] when this flush, or any write since the
    /// last flush that reported one, failed: rows were lost (a full disk, a closed pipe).
    pub fn flush(&self) -> Result<()> {
        let flushed = self.lock().0.flush();
        if flushed.is_err() {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
        }
        let errors = self.write_errors.load(Ordering::Relaxed);
        let new = errors - self.reported.swap(errors, Ordering::Relaxed).min(errors);
        if new == 0 {
            return Ok(());
        }
        Err(CoreError::Io {
            path: self.target.clone(),
            reason: format!(
                "{new} log writes failed since the last flush ({errors} in all){}",
                flushed.err().map(|e| format!(": {e}")).unwrap_or_default()
            ),
            errno: None,
        })
    }

    /// Rows that could not be written.
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, args: std::fmt::Arguments<'_>) {
        if self.lock().0.write_fmt(args).is_err() {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn row(&self, event: &str, addr: usize, bytes: usize, stream: Option<RawStream>) {
        self.event_rows();
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let device = match self.upstream.device_id() {
            Some(id) => id.to_string(),
            None => "host".into(),
        };
        let stream = stream
            .map(|s| format!("{:#x}", s.raw()))
            .unwrap_or_default();
        self.write(format_args!(
            "{}.{:09},{event},{device},{addr:#x},{bytes},{stream},{}\n",
            t.as_secs(),
            t.subsec_nanos(),
            self.source
        ));
    }

    /// Rows for the spills and restores on this device since the last row (one atomic
    /// load when there are none).
    fn event_rows(&self) {
        let last = super::events::last_event();
        let seen = self.events_seen.swap(last, Ordering::AcqRel);
        if last <= seen {
            return;
        }
        let Some(device) = self.upstream.device_id() else {
            return;
        };
        for e in super::events::events_since(seen, Some(device)) {
            let t = e.wall.duration_since(UNIX_EPOCH).unwrap_or_default();
            self.write(format_args!(
                "{}.{:09},{},{device},,{},,{}\n",
                t.as_secs(),
                t.subsec_nanos(),
                e.kind,
                e.bytes,
                self.source
            ));
        }
    }

    fn logged(
        &self,
        bytes: usize,
        stream: Option<RawStream>,
        r: Result<NonNull<u8>>,
    ) -> Result<NonNull<u8>> {
        match &r {
            Ok(p) => self.row("allocate", p.as_ptr() as usize, bytes, stream),
            Err(_) => self.row("allocate_failed", 0, bytes, stream),
        }
        r
    }
}

/// A CSV field: quoted when it holds a comma, quote or newline.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

impl MemoryResource for LoggingAdaptor {
    fn allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.logged(bytes, stream, self.upstream.allocate(bytes, align, stream))
    }

    fn allocate_zeroed(
        &self,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) -> Result<NonNull<u8>> {
        self.logged(
            bytes,
            stream,
            self.upstream.allocate_zeroed(bytes, align, stream),
        )
    }

    unsafe fn deallocate(
        &self,
        ptr: NonNull<u8>,
        bytes: usize,
        align: usize,
        stream: Option<RawStream>,
    ) {
        self.row("free", ptr.as_ptr() as usize, bytes, stream);
        // SAFETY: forwarded; this adaptor allocated through upstream with these arguments.
        unsafe { self.upstream.deallocate(ptr, bytes, align, stream) }
    }

    forward_to_upstream!();

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.upstream.memory_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostResource;

    #[test]
    fn a_full_disk_is_reported_by_flush() {
        if !Path::new("/dev/full").exists() {
            eprintln!("SKIPPED: no /dev/full on this system");
            return;
        }
        let log = LoggingAdaptor::to_path(Arc::new(HostResource), "/dev/full").unwrap();
        let p = log.allocate(64, 64, None).unwrap();
        // SAFETY: p came from this resource with these arguments and is freed once.
        unsafe { log.deallocate(p, 64, 64, None) };
        let e = log.flush().unwrap_err();
        assert!(e.to_string().contains("/dev/full"), "{e}");
        assert!(log.write_errors() >= 1);
    }
}
