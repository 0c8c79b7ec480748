//! Values kept aside per serving thread for the next request, so that a request does not pay
//! a free and an allocation for memory the next one needs again: the read and write buffers
//! a connection lets go of while it waits (downstream, `h1::server`; upstream, `h1::client`),
//! and the header maps of finished messages (`headers::map_with_capacity`). Each list is
//! bounded in count, and values larger than its limit are freed, so what a thread keeps does
//! not depend on its connections.
//!
//! The lists are last in, first out, which also keeps the memory a request touches in cache:
//! the buffer a request takes is the one the thread let go of last, whose bytes it has just
//! touched, not one that lay with a connection while a few hundred others were served
//! (docs/performance-history.md, "Memory touched per request").

use std::cell::{Cell, RefCell};
use std::thread::LocalKey;

use bytes::BytesMut;

/// A thread's list of values kept aside.
pub(crate) type List<T> = LocalKey<RefCell<Vec<T>>>;

/// What a list keeps: at most `count` values of at most `largest` capacity.
pub(crate) struct Bound {
    pub count: usize,
    pub largest: usize,
}

/// Keeps `value` (of capacity `capacity`, already emptied) on `list` for [`take`]; a value
/// with no capacity, one over the bound, or one more than the list keeps is dropped.
pub(crate) fn keep<T: 'static>(list: &'static List<T>, value: T, capacity: usize, bound: &Bound) {
    if capacity == 0 || capacity > bound.largest {
        return;
    }
    let _ = list.try_with(|l| {
        let mut l = l.borrow_mut();
        if l.len() < bound.count {
            l.push(value);
        }
    });
}

/// A value kept on `list`, if any.
pub(crate) fn take<T: 'static>(list: &'static List<T>) -> Option<T> {
    list.try_with(|l| l.borrow_mut().pop()).ok().flatten()
}

/// Buffers kept aside per thread (see [`give_back`]): at most 256, of up to 16 KiB. Enough
/// for the read and write buffers of 256 requests in flight on one thread: with 64, a thread
/// serving 128-256 connections freed what it could not keep and allocated it again a moment
/// later, on most requests (docs/performance-history.md, "Allocator thread caches for a few
/// hundred requests in flight"). What a thread keeps is at most 4 MiB, most often 256
/// buffers of 4 or 8 KiB, and only after that many were in use at once.
const BUFFER_BOUND: Bound = Bound {
    count: 256,
    largest: 16 * 1024,
};

thread_local! {
    static BUFFERS: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// Takes `buf` from a connection that does not need it now (which then holds none) and keeps
/// it aside for the next read or write on this thread. A buffer shared with bytes still in
/// use elsewhere (a body chunk split off it) is kept as well: it allocates anew when it must
/// grow, and never writes where those bytes lie.
///
/// [`keep`]'s rules, written out rather than called: moving the buffer out and back only
/// once it is known to be kept is about 80 instructions a request cheaper on this path
/// (`bench/instructions.sh`, docs/performance-history.md "Memory touched per request").
#[inline]
pub(crate) fn give_back(buf: &mut BytesMut) {
    let capacity = buf.capacity();
    // Given back already (or never taken): the common case on a connection's second look.
    if capacity == 0 {
        return;
    }
    if capacity <= BUFFER_BOUND.largest {
        let kept = BUFFERS.try_with(|l| {
            let mut l = l.borrow_mut();
            if l.len() >= BUFFER_BOUND.count {
                return false;
            }
            let mut b = std::mem::take(buf);
            b.clear();
            l.push(b);
            true
        });
        if kept == Ok(true) {
            return;
        }
    }
    *buf = BytesMut::new();
}

/// Makes room in `buf` for a read: at least `least` bytes free, else `chunk` more. An empty
/// buffer takes one of the thread's first; one that is still too small and holds nothing
/// (the thread's buffers include what is left of write buffers once a head was split off)
/// is replaced by a new one rather than grown: growing reallocates, which copies all of its
/// old allocation, and at a few hundred connections that copy wrote about 3.6 lines gone
/// cold a request (docs/performance-history.md, "Memory touched per request").
#[inline]
pub(crate) fn read_room(buf: &mut BytesMut, least: usize, chunk: usize) {
    if buf.capacity() == 0 {
        *buf = buffer();
    }
    if buf.capacity() - buf.len() >= least {
        return;
    }
    if buf.is_empty() {
        *buf = BytesMut::with_capacity(chunk);
    } else {
        buf.reserve(chunk);
    }
}

/// A buffer kept aside by [`give_back`], or a new empty one.
#[inline]
pub(crate) fn buffer() -> BytesMut {
    take(&BUFFERS).unwrap_or_default()
}

/// Runs `f` on the thread's scratch value in `slot` (a parse's field list): one per thread
/// rather than one per connection, so that a parse writes into memory the thread has just
/// used. Taken out of its slot for the call, so a call inside `f` gets a fresh value.
#[inline(always)]
pub(crate) fn with_scratch<T: Default + 'static, R>(
    slot: &'static LocalKey<Cell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    let mut value = slot.try_with(Cell::take).unwrap_or_default();
    let r = f(&mut value);
    let _ = slot.try_with(|s| s.set(value));
    r
}
