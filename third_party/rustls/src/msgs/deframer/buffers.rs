use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::mem;
use core::ops::Range;
#[cfg(feature = "std")]
use std::io;

#[cfg(feature = "std")]
use crate::msgs::message::MAX_WIRE_SIZE;

/// Conversion from a slice within a larger buffer into
/// a `Range` offset within.
#[derive(Debug)]
pub(crate) struct Locator {
    bounds: Range<*const u8>,
}

impl Locator {
    #[inline]
    pub(crate) fn new(slice: &[u8]) -> Self {
        Self {
            bounds: slice.as_ptr_range(),
        }
    }

    #[inline]
    pub(crate) fn locate(&self, slice: &[u8]) -> Range<usize> {
        let bounds = slice.as_ptr_range();
        debug_assert!(self.fully_contains(slice));
        let start = bounds.start as usize - self.bounds.start as usize;
        let len = bounds.end as usize - bounds.start as usize;
        Range {
            start,
            end: start + len,
        }
    }

    #[inline]
    pub(crate) fn fully_contains(&self, slice: &[u8]) -> bool {
        let bounds = slice.as_ptr_range();
        bounds.start >= self.bounds.start && bounds.end <= self.bounds.end
    }
}

/// Conversion from a `Range` offset to the original slice.
pub(crate) struct Delocator<'b> {
    slice: &'b [u8],
}

impl<'b> Delocator<'b> {
    #[inline]
    pub(crate) fn new(slice: &'b [u8]) -> Self {
        Self { slice }
    }

    #[inline]
    pub(crate) fn slice_from_range(&'_ self, range: &Range<usize>) -> &'b [u8] {
        // safety: this unwrap is safe so long as `range` came from `locate()`
        // for the same buffer
        self.slice.get(range.clone()).unwrap()
    }

    #[inline]
    pub(crate) fn locator(self) -> Locator {
        Locator::new(self.slice)
    }
}

/// Reordering the underlying buffer based on ranges.
pub(crate) struct Coalescer<'b> {
    slice: &'b mut [u8],
}

impl<'b> Coalescer<'b> {
    #[inline]
    pub(crate) fn new(slice: &'b mut [u8]) -> Self {
        Self { slice }
    }

    #[inline]
    pub(crate) fn copy_within(&mut self, from: Range<usize>, to: Range<usize>) {
        debug_assert!(from.len() == to.len());
        debug_assert!(self.slice.get(from.clone()).is_some());
        debug_assert!(self.slice.get(to.clone()).is_some());
        self.slice.copy_within(from, to.start);
    }

    #[inline]
    pub(crate) fn delocator(self) -> Delocator<'b> {
        Delocator::new(self.slice)
    }
}

/// Accounting structure tracking progress in parsing a single buffer.
#[derive(Clone, Debug)]
pub(crate) struct BufferProgress {
    /// Prefix of the buffer that has been processed so far.
    ///
    /// `processed` may exceed `discard`, that means we have parsed
    /// some buffer, but are still using it.  This happens due to
    /// in-place decryption of incoming records, and in-place
    /// reassembly of handshake messages.
    ///
    /// 0 <= processed <= len
    processed: usize,

    /// Prefix of the buffer that can be removed.
    ///
    /// If `discard` exceeds `processed`, that means we are ignoring
    /// data without processing it.
    ///
    /// 0 <= discard <= len
    discard: usize,
}

impl BufferProgress {
    pub(super) fn new(processed: usize) -> Self {
        Self {
            processed,
            discard: 0,
        }
    }

    #[inline]
    pub(crate) fn add_discard(&mut self, discard: usize) {
        self.discard += discard;
    }

    #[inline]
    pub(crate) fn add_processed(&mut self, processed: usize) {
        self.processed += processed;
    }

    #[inline]
    pub(crate) fn take_discard(&mut self) -> usize {
        // the caller is about to discard `discard` bytes
        // from the front of the buffer.  adjust `processed`
        // down by the same amount.
        self.processed = self
            .processed
            .saturating_sub(self.discard);
        mem::take(&mut self.discard)
    }

    #[inline]
    pub(crate) fn processed(&self) -> usize {
        self.processed
    }
}

#[derive(Default, Debug)]
pub(crate) struct DeframerVecBuffer {
    /// Buffer of data read from the socket, in the process of being parsed into messages.
    ///
    /// For buffer size management, checkout out the [`DeframerVecBuffer::prepare_read()`] method.
    buf: Vec<u8>,

    /// What size prefix of `buf` is used.
    used: usize,

    /// TALOS patch: where the bytes not yet discarded start in `buf`
    /// (`start..used`); zero after every `compact`.
    start: usize,

    /// TALOS patch: the last read filled all the room it was given, so more
    /// is likely waiting (a download): reads offer [`STREAM_READ_SIZE`]
    /// bytes until one finds nothing waiting (`WouldBlock`).
    streaming: bool,

    /// TALOS patch: decrypted application data not yet read, where it was
    /// decrypted (ranges of `buf` before `start`, in the order received).
    /// The reader copies it out from here; released rustls copied each
    /// record's plaintext into a buffer of its own first.
    held: VecDeque<Range<usize>>,

    /// TALOS patch: the sum of the `held` ranges' lengths.
    held_len: usize,
}

/// TALOS patch: how much one read may bring in while data streams in,
/// several records at once. rustls alone offers 4 KiB per read: a 1 MiB
/// reply took some seventy `recvfrom` calls. Only connections past their
/// handshake that found a read's room full use it, and the buffer shrinks
/// back as soon as a read finds the stream paused.
#[cfg(feature = "std")]
pub(crate) const STREAM_READ_SIZE: usize = 64 * 1024;

impl DeframerVecBuffer {
    /// Discard `taken` bytes from the start of our buffer.
    ///
    /// TALOS patch: only moves where the buffer starts; the bytes left are
    /// moved to the front once, before the next read (`compact`). Released
    /// rustls moved them after every record, so a read that brought in
    /// several records moved most of them again for each one.
    pub(crate) fn discard(&mut self, taken: usize) {
        self.start = Ord::min(self.start + taken, self.used);
        self.reset_if_drained();
    }

    /// TALOS patch: with nothing left to process or to read, the next read
    /// starts at the front again.
    fn reset_if_drained(&mut self) {
        if self.start == self.used && self.held.is_empty() {
            self.start = 0;
            self.used = 0;
        }
    }

    /// TALOS patch: moves the bytes not yet discarded, and any held
    /// plaintext before them, to the front.
    fn compact(&mut self) {
        let keep = match self.held.front() {
            Some(first) => Ord::min(first.start, self.start),
            None => self.start,
        };
        if keep > 0 {
            /* Before:
             * +----------+---------------+----------+----------+
             * | taken    | held (if any) | pending  |xxxxxxxxxx|
             * +----------+---------------+----------+----------+
             * 0          ^ keep          ^ start    ^ self.used
             *
             * After:
             * +---------------+----------+---------------------+
             * | held (if any) | pending  |xxxxxxxxxxxxxxxxxxxxx|
             * +---------------+----------+---------------------+
             * 0                          ^ self.used
             */
            self.buf.copy_within(keep..self.used, 0);
            for range in self.held.iter_mut() {
                range.start -= keep;
                range.end -= keep;
            }
            self.used -= keep;
            self.start -= keep;
        }
    }

    /// TALOS patch: keeps the plaintext at `range` of `filled()` (a record
    /// just processed, before it is discarded) for the reader.
    pub(crate) fn hold(&mut self, range: Range<usize>) {
        if range.start == range.end {
            return;
        }
        let range = self.start + range.start..self.start + range.end;
        debug_assert!(range.end <= self.used);
        self.held_len += range.len();
        self.held.push_back(range);
    }

    /// TALOS patch: how many plaintext bytes are held for the reader.
    pub(crate) fn held_len(&self) -> usize {
        self.held_len
    }

    /// TALOS patch: the first held plaintext, if any.
    pub(crate) fn first_held(&self) -> Option<&[u8]> {
        self.held
            .front()
            .map(|range| &self.buf[range.clone()])
    }

    /// TALOS patch: marks `used` bytes of the first held plaintext as read.
    /// Like `BufRead::consume`, `used` may not exceed `first_held()`.
    pub(crate) fn consume_held(&mut self, used: usize) {
        let Some(first) = self.held.front_mut() else {
            assert!(used == 0, "illegal `BufRead::consume` usage");
            return;
        };
        assert!(used <= first.len(), "illegal `BufRead::consume` usage");
        first.start += used;
        self.held_len -= used;
        if first.start == first.end {
            self.held.pop_front();
            self.reset_if_drained();
        }
    }

    /// TALOS patch: copies held plaintext into `out`, in order, as much as
    /// fits; returns how much.
    pub(crate) fn read_held(&mut self, out: &mut [u8]) -> usize {
        let mut done = 0;
        while done < out.len() {
            let Some(first) = self.first_held() else {
                break;
            };
            let n = Ord::min(first.len(), out.len() - done);
            out[done..done + n].copy_from_slice(&first[..n]);
            self.consume_held(n);
            done += n;
        }
        done
    }

    /// TALOS patch: frees the buffer if no bytes wait in it, and says whether
    /// it is now empty. The next read allocates it again (`prepare_read`).
    pub(crate) fn release_if_empty(&mut self) -> bool {
        if self.used == self.start && self.held.is_empty() {
            self.buf = Vec::new();
            self.start = 0;
            self.used = 0;
            self.streaming = false;
            true
        } else {
            false
        }
    }

    pub(crate) fn filled_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.used]
    }

    pub(crate) fn filled(&self) -> &[u8] {
        &self.buf[self.start..self.used]
    }
}

#[cfg(feature = "std")]
impl DeframerVecBuffer {
    /// Read some bytes from `rd`, and add them to the buffer.
    pub(crate) fn read(&mut self, rd: &mut dyn io::Read, in_handshake: bool) -> io::Result<usize> {
        if let Err(err) = self.prepare_read(in_handshake) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, err));
        }

        // Try to do the largest reads possible. Note that if
        // we get a message with a length field out of range here,
        // we do a zero length read.  That looks like an EOF to
        // the next layer up, which is fine.
        let room = self.buf.len() - self.used;
        let new_bytes = match rd.read(&mut self.buf[self.used..]) {
            Ok(n) => n,
            Err(err) => {
                // TALOS patch: nothing waiting: the stream, if any, paused,
                // and its buffer shrinks now by the usual rule, not at the
                // next read (a connection may wait long for that: pooled,
                // or between requests).
                if err.kind() == io::ErrorKind::WouldBlock && self.streaming {
                    self.streaming = false;
                    let _ = self.prepare_read(in_handshake);
                }
                return Err(err);
            }
        };
        self.used += new_bytes;
        // TALOS patch: a read that filled its room leaves more waiting.
        if new_bytes == room && !in_handshake {
            self.streaming = true;
        }
        Ok(new_bytes)
    }

    /// Resize the internal `buf` if necessary for reading more bytes.
    fn prepare_read(&mut self, is_joining_hs: bool) -> Result<(), &'static str> {
        self.compact();

        /// TLS allows for handshake messages of up to 16MB.  We
        /// restrict that to 64KB to limit potential for denial-of-
        /// service.
        const MAX_HANDSHAKE_SIZE: u32 = 0xffff;

        const READ_SIZE: usize = 4096;

        // We allow a maximum of 64k of buffered data for handshake messages only. Enforce this
        // by varying the maximum allowed buffer size here based on whether a prefix of a
        // handshake payload is currently being buffered. Given that the first read of such a
        // payload will only ever be 4k bytes, the next time we come around here we allow a
        // larger buffer size. Once the large message and any following handshake messages in
        // the same flight have been consumed, `pop()` will call `discard()` to reset `used`.
        // At this point, the buffer resizing logic below should reduce the buffer size.
        //
        // TALOS patch: past the handshake, the buffer may also hold one read
        // of `STREAM_READ_SIZE` beside a partial record.
        let allow_max = match is_joining_hs {
            true => MAX_HANDSHAKE_SIZE as usize,
            false => MAX_WIRE_SIZE + STREAM_READ_SIZE,
        };

        if self.used >= allow_max {
            return Err("message buffer full");
        }

        // TALOS patch: a streaming connection keeps its buffer at
        // `allow_max` and offers every free byte of it to each read (at least
        // `STREAM_READ_SIZE`: what is left after processing is less than one
        // record), with no resizing while the stream lasts.
        if self.streaming && !is_joining_hs {
            if self.buf.len() != allow_max {
                self.buf.resize(allow_max, 0);
            }
            return Ok(());
        }

        // If we can and need to increase the buffer size to allow a 4k read, do so. After
        // dealing with a large handshake message (exceeding `OutboundOpaqueMessage::MAX_WIRE_SIZE`),
        // make sure to reduce the buffer size again (large messages should be rare).
        // Also, reduce the buffer size if there are neither full nor partial messages in it,
        // which usually means that the other side suspended sending data.
        //
        // TALOS patch: "large" above includes a stream's buffer once the
        // stream pauses: beyond one record, or the next 4k read, it goes.
        let need_capacity = Ord::min(allow_max, self.used + READ_SIZE);
        if need_capacity > self.buf.len() {
            self.buf.resize(need_capacity, 0);
        } else if self.used == 0 || self.buf.len() > Ord::max(need_capacity, MAX_WIRE_SIZE) {
            self.buf.resize(need_capacity, 0);
            self.buf.shrink_to(need_capacity);
        }

        Ok(())
    }

    /// Append `bytes` to the end of this buffer.
    ///
    /// Return a `Range` saying where it went.
    pub(crate) fn extend(&mut self, bytes: &[u8]) -> Range<usize> {
        self.compact();
        let len = bytes.len();
        let start = self.used;
        let end = start + len;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        self.buf[start..end].copy_from_slice(bytes);
        self.used += len;
        Range { start, end }
    }
}

/// A borrowed version of [`DeframerVecBuffer`] that tracks discard operations
#[derive(Debug)]
pub(crate) struct DeframerSliceBuffer<'a> {
    // a fully initialized buffer that will be deframed
    buf: &'a mut [u8],
    // number of bytes to discard from the front of `buf` at a later time
    discard: usize,
}

impl<'a> DeframerSliceBuffer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, discard: 0 }
    }

    /// Tracks a pending discard operation of `num_bytes`
    pub(crate) fn queue_discard(&mut self, num_bytes: usize) {
        self.discard += num_bytes;
    }

    pub(crate) fn pending_discard(&self) -> usize {
        self.discard
    }

    pub(crate) fn filled_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.discard..]
    }
}
