//! Counters and histograms kept per serving thread and summed when scraped, so that the
//! request path never writes a cache line another thread writes (issue #12, "no shared cache
//! lines on the hot path"; docs/observability.md, "Per-thread counters").
//!
//! There are `shard_count()` shards, twice the CPUs rounded up to a power of two, and every
//! value lives in one 128-byte-aligned block per shard. A serving thread holds a shard of the
//! upper half alone ([`claim`]) and counts into it with plain loads and stores; any other
//! thread takes a shard of the lower half the first time it counts (round robin) and counts
//! with atomic adds, so that threads that share one (blocking threads, a runtime larger than
//! the CPU count) lose nothing, they merely touch the same line. A thread only writes its own
//! shard's block; a scrape reads every shard and adds them up.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::MetricType;

/// Cells per block: 16 x 8 bytes = 128 bytes, the unit x86 prefetches lines in pairs of.
const LANES: usize = 16;

/// One shard's block of cells, aligned so that no two shards share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Block([AtomicU64; LANES]);

/// The number of shards: twice the CPUs, a power of two, at least 4, at most 256.
fn shard_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (2 * cpus).next_power_of_two().clamp(4, 256)
    })
}

/// Set in a thread's shard word when it holds its shard alone ([`claim`]).
const ALONE: usize = 1 << (usize::BITS - 1);

thread_local! {
    /// This thread's shard (`usize::MAX` until it first counts), with [`ALONE`] set while the
    /// thread holds it alone.
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Which shards a thread holds alone: those of the upper half (at least as many as the
/// CPUs) may be; the lower half are the other threads', never held alone. A thread that
/// counts with atomic adds must never share a shard with one that holds it alone (a load
/// and a store around its add would lose it), so the halves stay apart.
static CLAIMED: [AtomicBool; 256] = [const { AtomicBool::new(false) }; 256];

/// The current thread's shard word: its index, and [`ALONE`].
#[inline]
fn shard_word() -> usize {
    SHARD.with(|s| {
        let i = s.get();
        if i != usize::MAX {
            return i;
        }
        // Not a serving thread (or one past the upper half): round robin over the lower
        // half, counted in with atomic adds.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let i = NEXT.fetch_add(1, Ordering::Relaxed) & (shard_count() / 2 - 1);
        s.set(i);
        i
    })
}

/// The current thread's shard index.
#[inline]
fn shard() -> usize {
    shard_word() & !ALONE
}

/// A serving thread's hold on a shard of its own, for as long as it lives: its counts are
/// then a load and a store, not an atomic add (a `lock` instruction, about 20 cycles, several
/// times per request). No other thread writes that shard meanwhile, and a scrape only reads.
/// With every shard held (more serving threads than twice the CPUs), the thread counts
/// into a shared one as other threads do.
pub(crate) struct Claim(Option<usize>);

/// Takes a shard for the current thread alone (see [`Claim`]).
pub(crate) fn claim() -> Claim {
    let n = shard_count();
    let free = (n / 2..n).find(|&i| {
        CLAIMED[i]
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    });
    if let Some(i) = free {
        SHARD.with(|s| s.set(i | ALONE));
    }
    Claim(free)
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            // Counted from now on as any other thread (if at all).
            let _ = SHARD.try_with(|s| s.set(usize::MAX));
            CLAIMED[i].store(false, Ordering::Release);
        }
    }
}

/// `slots` counters, one copy per shard.
#[derive(Debug)]
pub(crate) struct Cells {
    /// Blocks per shard.
    stride: usize,
    blocks: Box<[Block]>,
}

impl Cells {
    /// `slots` counters at zero.
    pub(crate) fn new(slots: usize) -> Self {
        let stride = slots.div_ceil(LANES).max(1);
        Self {
            stride,
            blocks: (0..stride * shard_count())
                .map(|_| Block::default())
                .collect(),
        }
    }

    /// Adds `n` to counter `slot` in this thread's shard.
    #[inline]
    pub(crate) fn add(&self, slot: usize, n: u64) {
        let word = shard_word();
        let block = (word & !ALONE) * self.stride + slot / LANES;
        let cell = &self.blocks[block].0[slot % LANES];
        if word & ALONE != 0 {
            cell.store(
                cell.load(Ordering::Relaxed).wrapping_add(n),
                Ordering::Relaxed,
            );
        } else {
            cell.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Takes `n` from counter `slot` in this thread's shard. A shard may go below zero (a
    /// count started on another thread); the sum wraps back.
    #[inline]
    pub(crate) fn sub(&self, slot: usize, n: u64) {
        // Adding wraps (the atomic add as the plain one): adding -n takes n away.
        self.add(slot, n.wrapping_neg());
    }

    /// Counter `slot` summed over every shard.
    pub(crate) fn sum(&self, slot: usize) -> u64 {
        self.blocks
            .iter()
            .skip(slot / LANES)
            .step_by(self.stride)
            .map(|b| b.0[slot % LANES].load(Ordering::Relaxed))
            .fold(0u64, u64::wrapping_add)
    }
}

/// One `T` per shard, each on cache lines of its own: a thread uses its shard's copy
/// (`here`), and whatever needs every copy (a sum, a replacement) walks `all`. For values the
/// request path writes that every serving thread would otherwise write to the same line (a
/// shared count, the reference count of a shared `Arc`).
#[derive(Debug)]
pub(crate) struct PerThread<T>(Box<[Padded<T>]>);

#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> PerThread<T> {
    /// One copy per shard, each made by `make`.
    pub(crate) fn new(mut make: impl FnMut() -> T) -> Self {
        Self((0..shard_count()).map(|_| Padded(make())).collect())
    }

    /// This thread's copy.
    #[inline]
    pub(crate) fn here(&self) -> &T {
        &self.0[shard()].0
    }

    /// Every copy.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        self.0.iter().map(|p| &p.0)
    }
}

/// A counter kept per thread; a clone counts into the same value.
#[derive(Clone, Debug)]
pub struct ShardedCounter(Arc<Cells>);

impl Default for ShardedCounter {
    fn default() -> Self {
        Self(Arc::new(Cells::new(1)))
    }
}

impl ShardedCounter {
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.0.add(0, 1);
    }

    /// The value summed over every thread.
    pub fn get(&self) -> u64 {
        self.0.sum(0)
    }
}

impl EncodeMetric for ShardedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A gauge kept per thread, for a value every serving thread moves on every request (the
/// pool's idle connections: one down at check-out, one up at check-in). One shared
/// prometheus-client `Gauge` was a line both threads wrote per request. A thread's share may
/// go below zero (a connection taken on one thread and counted back on another): a counter's
/// cells, which wrap, and the sum wraps back.
#[derive(Clone, Debug, Default)]
pub struct ShardedGauge(ShardedCounter);

impl ShardedGauge {
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.0.inc();
    }

    /// Takes one away.
    #[inline]
    pub fn dec(&self) {
        self.dec_by(1);
    }

    /// Takes `n` away.
    pub fn dec_by(&self, n: u64) {
        self.0 .0.sub(0, n);
    }

    /// The value summed over every thread.
    pub fn get(&self) -> i64 {
        self.0.get() as i64
    }
}

impl EncodeMetric for ShardedGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// A histogram with fixed buckets kept per thread, encoded as prometheus-client's
/// `Histogram` is. The sum is kept in integer nanoseconds (exact, and one atomic add).
#[derive(Clone, Debug)]
pub struct ShardedHistogram(Arc<HistogramInner>);

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, the last one `+Inf`.
    bounds: Box<[f64]>,
    /// One count per bucket (not cumulative), then the sum in nanoseconds.
    cells: Cells,
}

impl ShardedHistogram {
    /// A histogram with these upper bounds (finite ones kept) and `+Inf`.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Box<[f64]> = bounds
            .into_iter()
            .filter(|b| b.is_finite())
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        let cells = Cells::new(bounds.len() + 1);
        Self(Arc::new(HistogramInner { bounds, cells }))
    }

    /// Records a value in seconds (NaN lands in `+Inf`, as prometheus-client puts it).
    #[inline]
    pub fn observe(&self, v: f64) {
        let h = &*self.0;
        let last = h.bounds.len() - 1;
        let bucket = h.bounds.iter().position(|b| *b >= v).unwrap_or(last);
        h.cells.add(bucket, 1);
        // Rounded (a `Duration`'s seconds times 1e9 can land just below its whole
        // nanoseconds); `as` saturates, so a negative or NaN value adds nothing.
        h.cells.add(h.bounds.len(), (v * 1e9 + 0.5) as u64);
    }

    /// Sum (seconds), count and the per-bucket counts, over every thread.
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let h = &*self.0;
        let buckets: Vec<(f64, u64)> = h
            .bounds
            .iter()
            .enumerate()
            .map(|(i, b)| (*b, h.cells.sum(i)))
            .collect();
        // The count is the buckets' total, so `_count` always equals the `+Inf` bucket.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = h.cells.sum(h.bounds.len()) as f64 / 1e9;
        (sum, count, buckets)
    }
}

impl EncodeMetric for ShardedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A counter family whose label sets are known in advance, each one a slot of per-thread
/// cells. A label set outside the table goes to a shared prometheus-client family (rare
/// paths only), and both are encoded as one family. A slot's series appears once it has
/// counted, as a `Family` series appears once created, or from the start when pinned.
#[derive(Clone, Debug)]
pub struct SlotFamily<L: Clone + std::hash::Hash + Eq>(Arc<SlotInner<L>>);

#[derive(Debug)]
struct SlotInner<L: Clone + std::hash::Hash + Eq> {
    labels: Box<[L]>,
    pinned: Box<[bool]>,
    cells: Cells,
    other: Family<L, Counter>,
}

impl<L: Clone + std::hash::Hash + Eq> SlotFamily<L> {
    /// A family over `labels`; `pinned` ones are shown at zero before they count.
    pub fn new(labels: Vec<L>, pinned: impl Fn(&L) -> bool) -> Self {
        let pinned = labels.iter().map(pinned).collect();
        let cells = Cells::new(labels.len());
        Self(Arc::new(SlotInner {
            labels: labels.into(),
            pinned,
            cells,
            other: Family::default(),
        }))
    }

    /// Counts one for the label set in `slot` (an index into the table given to `new`).
    #[inline]
    pub fn inc_slot(&self, slot: usize) {
        debug_assert!(slot < self.0.labels.len());
        self.0.cells.add(slot, 1);
    }

    /// Counts one for a label set outside the table.
    pub fn inc_other(&self, labels: &L) {
        self.0.other.get_or_create(labels).inc();
    }

    /// The value of the series in `slot`, over every thread.
    pub fn get_slot(&self, slot: usize) -> u64 {
        self.0.cells.sum(slot)
    }

    fn shown(&self) -> impl Iterator<Item = (&L, u64)> {
        let f = &*self.0;
        f.labels
            .iter()
            .enumerate()
            .map(move |(i, l)| (l, f.cells.sum(i), f.pinned[i]))
            .filter(|(_, n, pinned)| *n > 0 || *pinned)
            .map(|(l, n, _)| (l, n))
    }
}

impl<L> EncodeMetric for SlotFamily<L>
where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync,
{
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, n) in self.shown() {
            encoder
                .encode_family(labels)?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        self.0.other.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }

    fn is_empty(&self) -> bool {
        self.shown().next().is_none() && self.0.other.is_empty()
    }
}

/// The per-thread counts of one route by status class (`1xx`..`5xx`); a clone counts into
/// the same series.
#[derive(Clone, Debug)]
pub struct RouteSeries(Arc<Cells>);

impl Default for RouteSeries {
    fn default() -> Self {
        Self(Arc::new(Cells::new(super::CLASSES.len())))
    }
}

impl RouteSeries {
    /// Counts one response of class index `class` (0: `1xx`).
    #[inline]
    pub(crate) fn inc(&self, class: usize) {
        self.0.add(class, 1);
    }
}

/// `upkeep_route_responses_total`: a series per (route, group) made when a route table is
/// built (kept across reloads, as a `Family` series is), counted per thread.
#[derive(Clone, Debug, Default)]
pub struct RouteFamily(Arc<RouteInner>);

/// A route's series with its `route` and `group` labels.
type Named = (Arc<str>, Arc<str>, RouteSeries);

#[derive(Debug, Default)]
struct RouteInner {
    series: Mutex<Vec<Named>>,
    /// A class outside `1xx`..`5xx` (none is made today).
    other: Family<super::RouteLabels, Counter>,
}

impl RouteFamily {
    /// The series of `route` in `group`, made on first use; the same one for every later
    /// route table that has this route.
    pub fn series(&self, route: &Arc<str>, group: &Arc<str>) -> RouteSeries {
        let mut all = self.0.series.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, s)) = all.iter().find(|(r, g, _)| r == route && g == group) {
            return s.clone();
        }
        let s = RouteSeries::default();
        all.push((route.clone(), group.clone(), s.clone()));
        s
    }

    /// Counts one for labels whose class has no slot.
    pub(crate) fn inc_other(&self, labels: &super::RouteLabels) {
        self.0.other.get_or_create(labels).inc();
    }

    fn shown(&self) -> Vec<(super::RouteLabels, u64)> {
        let all = self.0.series.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (route, group, s) in all.iter() {
            for (i, class) in super::CLASSES.iter().enumerate() {
                let n = s.0.sum(i);
                if n > 0 {
                    let labels = super::RouteLabels {
                        route: route.clone(),
                        group: group.clone(),
                        class,
                    };
                    out.push((labels, n));
                }
            }
        }
        out
    }
}

impl EncodeMetric for RouteFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, n) in self.shown() {
            encoder
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&n, None)?;
        }
        self.0.other.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }

    fn is_empty(&self) -> bool {
        self.shown().is_empty() && self.0.other.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_thread_copies_are_one_per_shard_and_a_thread_keeps_its_own() {
        let copies = PerThread::new(|| AtomicUsize::new(0));
        assert_eq!(copies.all().count(), shard_count());
        // As many threads as shards, each adding to its copy: all of them are counted once,
        // and a thread finds the same copy every time.
        std::thread::scope(|s| {
            for _ in 0..shard_count() {
                s.spawn(|| {
                    let mine: *const AtomicUsize = copies.here();
                    copies.here().fetch_add(1, Ordering::Relaxed);
                    assert!(std::ptr::eq(mine, copies.here()));
                });
            }
        });
        let total: usize = copies.all().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(total, shard_count());
        let lines: std::collections::HashSet<usize> = copies
            .all()
            .map(|c| c as *const AtomicUsize as usize / 128)
            .collect();
        assert_eq!(lines.len(), shard_count(), "each copy on its own 128 bytes");
    }

    #[test]
    fn counts_from_many_threads_add_up_in_one_read() {
        let c = ShardedCounter::default();
        let h = ShardedHistogram::new([0.001, 0.01]);
        let threads: Vec<_> = (0..3 * shard_count())
            .map(|_| {
                let (c, h) = (c.clone(), h.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        c.inc();
                        h.observe(0.005);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = 300 * shard_count() as u64;
        assert_eq!(c.get(), n);
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(count, n);
        assert_eq!(buckets, vec![(0.001, 0), (0.01, n), (f64::INFINITY, 0)]);
        assert!((sum - 0.005 * n as f64).abs() < 1e-6, "{sum}");
    }

    #[test]
    fn threads_holding_shards_alone_and_threads_sharing_them_count_exactly() {
        let cells = Arc::new(Cells::new(2));
        let n = shard_count();
        let threads: Vec<_> = (0..6)
            .map(|t| {
                let cells = cells.clone();
                std::thread::spawn(move || {
                    // Two threads hold a shard alone (when one is free: other tests' workers
                    // may hold them all), four count into the shared half.
                    let claim = (t < 2).then(claim);
                    if let Some(Claim(Some(i))) = &claim {
                        assert!((n / 2..n).contains(i), "held alone: {i} of {n}");
                        assert_eq!(shard_word(), i | ALONE);
                    } else {
                        assert!(shard() < n / 2, "shared: {} of {n}", shard());
                    }
                    for _ in 0..100_000 {
                        cells.add(0, 1);
                        cells.add(1, 3);
                        cells.sub(1, 1);
                    }
                    drop(claim);
                    // Let go of: counted as any other thread from here on.
                    assert!(shard_word() & ALONE == 0);
                    cells.add(0, 1);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(cells.sum(0), 600_006);
        assert_eq!(cells.sum(1), 1_200_000);
    }

    #[test]
    fn a_gauge_moved_up_on_one_thread_and_down_on_another_sums_right() {
        let g = ShardedGauge::default();
        let up = g.clone();
        std::thread::spawn(move || (0..10).for_each(|_| up.inc()))
            .join()
            .unwrap();
        // Another thread takes them away: its own share goes below zero.
        let down = g.clone();
        std::thread::spawn(move || {
            (0..3).for_each(|_| down.dec());
            down.dec_by(4);
        })
        .join()
        .unwrap();
        assert_eq!(g.get(), 3);
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("idle", "Idle.", g.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(text.contains("# TYPE idle gauge\nidle 3\n"), "{text}");
    }

    #[test]
    fn slots_past_one_block_stay_apart() {
        let c = Cells::new(40);
        for slot in 0..40 {
            c.add(slot, slot as u64 + 1);
        }
        for slot in 0..40 {
            assert_eq!(c.sum(slot), slot as u64 + 1);
        }
    }
}
