//! One array across several devices: [`RawArray::scatter`] splits it along its first axis
//! into parts on the devices given (peer copies from device data, host-to-device copies
//! from host data), [`RawArray::gather`] joins parts back into one array.
//!
//! Each copy runs on its device's legacy default stream after the source's pending work
//! (stream-wait-event); the copies to different devices overlap. A source read from
//! several streams gets one pending event after all of them (a join: one stream waits on
//! every copy's event), so later writes to it wait for every copy; nothing blocks the host
//! except the staged copies of pageable host memory, which return once read.

use std::sync::Arc;

use memarray_core::{HostBuffer, Location, LockToken};

use super::raw::RawArray;
use crate::buffer::DeviceBuffer;
use crate::copy::{self, Span};
use crate::device::Device;
use crate::error::{CudaError, Result};
use crate::event::{Enqueued, Event};
use crate::stream::StreamRef;

/// Rows per part when `rows` are split into `parts` as evenly as possible (the first
/// `rows % parts` parts get one more), like NumPy's `array_split`.
pub fn split_rows(rows: usize, parts: usize) -> Vec<usize> {
    if parts == 0 {
        return Vec::new();
    }
    (0..parts)
        .map(|i| rows / parts + usize::from(i < rows % parts))
        .collect()
}

/// Copies enqueued on several streams, joined into one point of one stream.
struct Join {
    events: Vec<Event>,
}

impl Join {
    fn new() -> Self {
        Self { events: Vec::new() }
    }

    fn add(&mut self, op: Enqueued) -> Result<()> {
        self.events.push(op.into_event()?);
        Ok(())
    }

    /// The legacy stream of `device`, made to wait on every copy: work after it, and an
    /// event recorded on it, come after all of them.
    fn on(self, device: &Arc<Device>) -> Result<Enqueued> {
        let stream = StreamRef::legacy();
        for e in &self.events {
            stream.wait_on(device, e)?;
        }
        Ok(Enqueued::new(stream, device.clone()))
    }
}

/// The current data of `a`: its host buffer (host access waited for) or its device buffer.
enum Data {
    Host(Arc<HostBuffer>),
    Device(Arc<DeviceBuffer>),
}

impl RawArray {
    fn row_bytes(&self) -> usize {
        self.shape[1..].iter().product::<usize>() * self.dtype.size()
    }

    fn current_data(&self) -> Result<Data> {
        Ok(match self.location {
            Location::Host => {
                self.dev.wait_host()?;
                Data::Host(self.host_buf()?.clone())
            }
            Location::Device(_) => Data::Device(self.dev.current()?),
        })
    }

    /// Splits the array along its first axis into `devices.len()` parts, part `i` a new
    /// array on `devices[i]` (sizes as NumPy's `array_split`; a device may repeat). Device
    /// data is copied peer to peer, host data host to device. The array is left as it was.
    pub fn scatter(&self, devices: &[u32], token: Option<LockToken>) -> Result<Vec<RawArray>> {
        self.check(token)?;
        if self.shape.is_empty() || devices.is_empty() {
            return Err(CudaError::InvalidArgument {
                what: "scatter",
                detail: format!(
                    "needs an array with a first axis and at least one device (shape {:?}, \
                     devices {devices:?})",
                    self.shape
                ),
            });
        }
        let row_bytes = self.row_bytes();
        let src = self.current_data()?;
        let mut parts = Vec::with_capacity(devices.len());
        let mut join = Join::new();
        let mut offset = 0usize;
        for (&dev, rows) in devices.iter().zip(split_rows(self.shape[0], devices.len())) {
            let stream = StreamRef::legacy();
            let mut shape = self.shape.clone();
            shape[0] = rows;
            let mut part = RawArray::empty_on(
                self.dtype,
                &shape,
                Location::Device(dev),
                Some(self.host_kind),
                Some(stream),
            )?;
            let len = rows * row_bytes;
            let dst = part.dev.current()?;
            let op = match &src {
                Data::Host(h) => {
                    // SAFETY: the host buffer is kept alive by `src` and, as the array's
                    // host copy, is not written by the host before its pending event,
                    // which the join below moves past this copy.
                    unsafe {
                        copy::enqueue(Span::Device(&dst, 0), Span::Host(h, offset), len, stream)?
                    }
                }
                Data::Device(d) => {
                    part.dev.current()?.device().link_peer(d.device())?;
                    self.dev.order(stream, dev)?;
                    // SAFETY: device memory only.
                    unsafe {
                        copy::enqueue(Span::Device(&dst, 0), Span::Device(d, offset), len, stream)?
                    }
                }
            };
            if let Some(op) = op {
                part.wrote(Enqueued::new(op.stream(), op.device().clone()))?;
                join.add(op)?;
            }
            offset += len;
            parts.push(part);
        }
        let home = Device::get(match self.location {
            Location::Device(d) => d,
            Location::Host => self.device_id,
        });
        if !join.events.is_empty() {
            self.was_read(&join.on(&home?)?)?;
        }
        Ok(parts)
    }

    /// One array at `to` holding `parts` (same dtype and trailing shape, on any devices or
    /// the host) concatenated along the first axis. The parts are left as they were.
    pub fn gather(parts: &[&RawArray], to: Location) -> Result<RawArray> {
        let first = parts.first().ok_or(CudaError::InvalidArgument {
            what: "gather",
            detail: "needs at least one part".into(),
        })?;
        if first.shape.is_empty() {
            return Err(CudaError::InvalidArgument {
                what: "gather",
                detail: "parts need a first axis (got a 0-d array)".into(),
            });
        }
        let mut rows = 0usize;
        for p in parts {
            p.check(None)?;
            if p.dtype != first.dtype || p.shape.get(1..) != first.shape.get(1..) {
                return Err(CudaError::InvalidArgument {
                    what: "gather",
                    detail: format!(
                        "parts must share dtype and trailing shape: {} {:?} vs {} {:?}",
                        first.dtype, first.shape, p.dtype, p.shape
                    ),
                });
            }
            rows += p.shape[0];
        }
        let mut shape = first.shape.clone();
        shape[0] = rows;
        let home = match to {
            Location::Device(d) => d,
            Location::Host => first.device_id,
        };
        let mut out = RawArray::empty_on(first.dtype, &shape, to, Some(first.host_kind), None)?;
        if matches!(to, Location::Device(_)) {
            out.device_id = home;
        }
        let dst = match to {
            Location::Host => Data::Host(out.host_buf()?.clone()),
            Location::Device(_) => Data::Device(out.dev.current()?),
        };
        let row_bytes = first.row_bytes();
        let mut join = Join::new();
        let mut offset = 0usize;
        for p in parts {
            let len = p.shape[0] * row_bytes;
            let src = p.current_data()?;
            // The copy runs on the destination device's stream, or for a host destination
            // on the source device's.
            let dev = match (&dst, p.location) {
                (Data::Device(_), _) => home,
                (Data::Host(_), Location::Device(d)) => d,
                (Data::Host(_), Location::Host) => home,
            };
            let stream = StreamRef::legacy();
            let (dspan, sspan) = match (&dst, &src) {
                (Data::Host(d), Data::Host(s)) => (Span::Host(d, offset), Span::Host(s, 0)),
                (Data::Host(d), Data::Device(s)) => (Span::Host(d, offset), Span::Device(s, 0)),
                (Data::Device(d), Data::Host(s)) => (Span::Device(d, offset), Span::Host(s, 0)),
                (Data::Device(d), Data::Device(s)) => (Span::Device(d, offset), Span::Device(s, 0)),
            };
            if let Data::Device(s) = &src {
                if let Data::Device(d) = &dst {
                    d.device().link_peer(s.device())?;
                }
                p.dev.order(stream, dev)?;
            }
            // SAFETY: `out` is new (nothing else reads or writes it until its event,
            // recorded after the join below); host sources were waited for and are kept
            // alive by `src` until the join orders their next writes after this copy.
            let op = unsafe { copy::enqueue(dspan, sspan, len, stream)? };
            if let Some(op) = op {
                if let Data::Device(_) = src {
                    p.was_read(&op)?;
                }
                join.add(op)?;
            }
            offset += len;
        }
        if !join.events.is_empty() {
            let op = join.on(&Device::get(home)?)?;
            out.wrote(op)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memarray_core::DType;

    #[test]
    fn rows_split_like_array_split() {
        assert_eq!(split_rows(10, 3), vec![4, 3, 3]);
        assert_eq!(split_rows(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(split_rows(0, 2), vec![0, 0]);
        assert_eq!(split_rows(5, 0), Vec::<usize>::new());
        for (rows, parts) in [(1000, 7), (3, 3), (1, 2)] {
            assert_eq!(split_rows(rows, parts).iter().sum::<usize>(), rows);
        }
    }

    #[test]
    fn host_parts_gather_on_the_host_in_order_and_bad_parts_are_refused() {
        let a = RawArray::from_bytes(DType::U8, &[2, 3], &[1, 2, 3, 4, 5, 6], 0).unwrap();
        let b = RawArray::from_bytes(DType::U8, &[1, 3], &[7, 8, 9], 0).unwrap();
        let g = RawArray::gather(&[&a, &b, &a], Location::Host).unwrap();
        assert_eq!(g.shape(), &[5, 3]);
        let mut out = [0u8; 15];
        g.read_all(&mut out, None).unwrap();
        assert_eq!(out, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6]);
        let c = RawArray::from_bytes(DType::U8, &[2, 2], &[0; 4], 0).unwrap();
        assert!(
            RawArray::gather(&[&a, &c], Location::Host).is_err(),
            "trailing shapes differ"
        );
        let d = RawArray::from_bytes(DType::I8, &[1, 3], &[0; 3], 0).unwrap();
        assert!(
            RawArray::gather(&[&a, &d], Location::Host).is_err(),
            "dtypes differ"
        );
        assert!(RawArray::gather(&[], Location::Host).is_err());
        let t = a.try_lock().unwrap();
        assert!(
            RawArray::gather(&[&a], Location::Host).is_err(),
            "a locked part"
        );
        a.unlock(t).unwrap();
    }

    #[test]
    fn scatter_refuses_0d_arrays_and_no_devices_before_touching_cuda() {
        let s = RawArray::zeros(DType::F32, &[], 0).unwrap();
        assert!(matches!(
            s.scatter(&[0], None),
            Err(CudaError::InvalidArgument { .. })
        ));
        let a = RawArray::zeros(DType::F32, &[4], 0).unwrap();
        assert!(matches!(
            a.scatter(&[], None),
            Err(CudaError::InvalidArgument { .. })
        ));
    }
}
