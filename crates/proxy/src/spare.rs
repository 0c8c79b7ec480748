//! Values kept aside per serving thread for the next request, so that a request does not pay
//! a free and an allocation for memory the next one needs again: the read and write buffers
//! an idle connection lets go of (`h1::server::wire`), and the header maps of finished
//! messages (`headers::map_with_capacity`). Each list is bounded in count, and values larger
//! than its limit are freed, so what a thread keeps does not depend on its connections.

use std::cell::RefCell;
use std::thread::LocalKey;

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
