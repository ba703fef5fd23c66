//! The eviction order's storage: FIFO lanes of unreferenced entries threaded
//! through the entries' own `links`, and min-heap lanes that keep each
//! entry's position themselves, so that releasing, taking back and evicting
//! an entry are O(1) (lists) or O(log n) (heaps) with no searching, no stale
//! places and no compaction.

use super::entries::{Entry, NIL, NO_LANE};
use super::table::Table;

/// `N` FIFO lanes as doubly linked lists: `links` is `[previous, next]`.
#[derive(Debug, Clone)]
pub(crate) struct ListLanes<const N: usize> {
    head: [u32; N],
    tail: [u32; N],
    len: [usize; N],
}

impl<const N: usize> Default for ListLanes<N> {
    fn default() -> Self {
        Self { head: [NIL; N], tail: [NIL; N], len: [0; N] }
    }
}

impl<const N: usize> ListLanes<N> {
    /// Appends entry `index` to `lane`.
    #[inline]
    pub(crate) fn push_back<M>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, index: u32) {
        let tail = self.tail[lane];
        let entry = entries.get_mut(index);
        entry.lane = u8::try_from(lane).unwrap_or(NO_LANE);
        entry.links = [tail, NIL];
        if tail == NIL {
            self.head[lane] = index;
        } else {
            entries.get_mut(tail).links[1] = index;
        }
        self.tail[lane] = index;
        self.len[lane] += 1;
    }

    /// Takes entry `index` out of its lane.
    #[inline]
    pub(crate) fn unlink<M>(&mut self, entries: &mut Table<Entry<M>>, index: u32) {
        let entry = entries.get_mut(index);
        let lane = usize::from(entry.lane);
        let [prev, next] = std::mem::replace(&mut entry.links, [NIL, NIL]);
        entry.lane = NO_LANE;
        if prev == NIL {
            self.head[lane] = next;
        } else {
            entries.get_mut(prev).links[1] = next;
        }
        if next == NIL {
            self.tail[lane] = prev;
        } else {
            entries.get_mut(next).links[0] = prev;
        }
        self.len[lane] -= 1;
    }

    /// The first non-empty lane and its oldest entry.
    #[inline]
    pub(crate) fn first(&self) -> Option<(usize, u32)> {
        (0..N).find(|&lane| self.len[lane] > 0).map(|lane| (lane, self.head[lane]))
    }

    /// The oldest entry of `lane`.
    #[inline]
    pub(crate) fn head(&self, lane: usize) -> Option<u32> {
        (self.len[lane] > 0).then_some(self.head[lane])
    }

    /// The newest entry of `lane`.
    #[inline]
    pub(crate) fn tail(&self, lane: usize) -> Option<u32> {
        (self.len[lane] > 0).then_some(self.tail[lane])
    }

    /// The lanes' entries, lane by lane, oldest first.
    pub(crate) fn walk<M>(&self, entries: &Table<Entry<M>>) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len.iter().sum());
        for &head in &self.head {
            let mut at = head;
            while at != NIL {
                out.push(at);
                at = entries.get(at).links[1];
            }
        }
        out
    }
}

/// What a heap lane orders its entries by: lowest first.
pub(crate) trait HeapKey {
    fn heap_key(&self) -> (f64, u64);
}

/// A heap place: the entry's key, kept beside its slot so that sifting reads
/// no entry. The priority is kept as an integer that orders as `f64::total_cmp`
/// orders the float, so a comparison is two integer compares.
#[derive(Debug, Clone, Copy)]
struct Place {
    rank: i64,
    order: u64,
    index: u32,
}

/// `priority` as an integer in `f64::total_cmp`'s order.
#[inline]
pub(super) fn rank_of(priority: f64) -> i64 {
    // Reinterpreting the bits is the point: total_cmp's own transform.
    #[allow(clippy::cast_possible_wrap)]
    let bits = priority.to_bits() as i64;
    #[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
    let flip = (((bits >> 63) as u64) >> 1) as i64;
    bits ^ flip
}

impl Place {
    #[inline]
    fn before(&self, other: &Place) -> bool {
        (self.rank, self.order) < (other.rank, other.order)
    }
}

/// Which of two rising runs, whose last keys are `lasts` (None: empty), a
/// new `key` joins so that both keep rising: the one whose last key is the
/// highest at or below it, else an empty one; None if it fits neither.
/// Choosing the tightest fit leaves the other run free for a lower sequence.
#[inline]
pub(super) fn run_to_join<K: Ord + Copy>(lasts: [Option<K>; 2], key: K) -> Option<usize> {
    let [first, second] = lasts;
    let fits = |last: Option<K>| last.is_some_and(|last| last <= key);
    match (fits(first), fits(second)) {
        (true, true) => Some(usize::from(second > first)),
        (true, false) => Some(0),
        (false, true) => Some(1),
        (false, false) if first.is_none() => Some(0),
        (false, false) if second.is_none() => Some(1),
        (false, false) => None,
    }
}

/// Where an entry of a [`HeapLanes`] is while in run `r`: `IN_RUN - r`;
/// below that, its heap position.
const IN_RUN: u32 = NIL - 1;

/// How many runs each lane of a [`HeapLanes`] has.
const RUNS: usize = 2;

/// `N` lanes of entries ordered by key, lowest first. Each lane is two runs
/// (FIFO lists, each of entries released at or above that run's latest
/// release, so each lowest first) and a binary min-heap of the rest, whose
/// positions are kept here by entry index so that sifting touches no entry.
/// A release joins the run whose latest key is the highest at or below its
/// own, else an empty run, else the heap. Where keys mostly rise with
/// release, as GDSF's aging clock makes them (a long video, or items of one
/// size and frequency), and where two such sequences interleave (items
/// released once beside items hit often, whose counts rise together),
/// releases and evictions are O(1) list operations; the heap takes the
/// releases that fit neither run.
#[derive(Debug, Clone)]
pub(crate) struct HeapLanes<const N: usize> {
    runs: [ListLanes<N>; RUNS],
    /// By run and lane: the key of the run's latest release, kept while the
    /// run is not empty. Its entry may have left the run since; the key is
    /// then above every key the run holds, so a release at or above it still
    /// keeps the run in order.
    last_keys: [[(i64, u64); N]; RUNS],
    heaps: [Vec<Place>; N],
    /// By entry index: the heap position, or `IN_RUN - run`.
    positions: Vec<u32>,
}

impl<const N: usize> Default for HeapLanes<N> {
    fn default() -> Self {
        Self {
            runs: [ListLanes::default(), ListLanes::default()],
            last_keys: [[(i64::MIN, 0); N]; RUNS],
            heaps: std::array::from_fn(|_| Vec::new()),
            positions: Vec::new(),
        }
    }
}

/// A heap position as stored; a cache holds far fewer than 2^32 entries.
#[inline]
fn stored(position: usize) -> u32 {
    u32::try_from(position).unwrap_or(NIL)
}

#[inline]
fn key_of<M: HeapKey>(entries: &Table<Entry<M>>, index: u32) -> (i64, u64) {
    let (priority, order) = entries.get(index).meta.heap_key();
    (rank_of(priority), order)
}

impl<const N: usize> HeapLanes<N> {
    pub(crate) fn push<M: HeapKey>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, index: u32) {
        let key = key_of(entries, index);
        if self.positions.len() <= index as usize {
            self.positions.resize(index as usize + 1, NIL);
        }
        if let Some(run) = self.run_for(lane, key) {
            self.runs[run].push_back(entries, lane, index);
            self.last_keys[run][lane] = key;
            self.positions[index as usize] = IN_RUN - stored(run);
            return;
        }
        entries.get_mut(index).lane = u8::try_from(lane).unwrap_or(NO_LANE);
        let heap = &mut self.heaps[lane];
        heap.push(Place { rank: key.0, order: key.1, index });
        let last = heap.len() - 1;
        sift_up(heap, &mut self.positions, last);
    }

    /// The run of `lane` a release with `key` joins (see [`run_to_join`]);
    /// None for the heap.
    #[inline]
    fn run_for(&self, lane: usize, key: (i64, u64)) -> Option<usize> {
        run_to_join([0, 1].map(|run| self.runs[run].tail(lane).map(|_| self.last_keys[run][lane])), key)
    }

    pub(crate) fn remove<M>(&mut self, entries: &mut Table<Entry<M>>, index: u32) {
        let position = self.positions[index as usize];
        // A heap position, or NIL (never placed), wraps to far past the runs.
        let run = IN_RUN.wrapping_sub(position) as usize;
        if run < RUNS {
            self.runs[run].unlink(entries, index);
            return;
        }
        let entry = entries.get_mut(index);
        let lane = usize::from(entry.lane);
        entry.lane = NO_LANE;
        let heap = &mut self.heaps[lane];
        let last = heap.pop().expect("the entry is in this heap");
        let position = position as usize;
        if position < heap.len() {
            // Floyd's removal: the hole sinks to a leaf along the lower
            // children (one comparison a level), then the last place fills
            // it and rises as far as it must.
            let leaf = sink_hole(heap, &mut self.positions, position);
            heap[leaf] = last;
            sift_up(heap, &mut self.positions, leaf);
        }
    }

    /// Empties every lane, keeping the storage. The entries it held keep
    /// their `lane`; their links and positions are no longer read.
    pub(crate) fn clear(&mut self) {
        self.runs = [ListLanes::default(), ListLanes::default()];
        for heap in &mut self.heaps {
            heap.clear();
        }
    }

    /// The first non-empty lane's lowest entry.
    pub(crate) fn first<M: HeapKey>(&self, entries: &Table<Entry<M>>) -> Option<u32> {
        (0..N).find_map(|lane| {
            let top = self.heaps[lane].first();
            match [self.runs[0].head(lane), self.runs[1].head(lane)] {
                [None, None] => top.map(|place| place.index),
                [Some(head), None] | [None, Some(head)] if top.is_none() => Some(head),
                heads => {
                    let in_runs = heads.into_iter().flatten().map(|head| (key_of(entries, head), head));
                    in_runs.chain(top.map(|place| ((place.rank, place.order), place.index))).min().map(|(_, index)| index)
                }
            }
        })
    }

    /// Every lane's entries, lane by lane, lowest first.
    pub(crate) fn walk<M: HeapKey>(&self, entries: &Table<Entry<M>>) -> Vec<u32> {
        let in_runs: Vec<u32> = self.runs.iter().flat_map(|run| run.walk(entries)).collect();
        let mut out = Vec::new();
        for (lane, heap) in self.heaps.iter().enumerate() {
            let mut places: Vec<((i64, u64), u32)> = heap.iter().map(|place| ((place.rank, place.order), place.index)).collect();
            for &index in &in_runs {
                if usize::from(entries.get(index).lane) == lane {
                    places.push((key_of(entries, index), index));
                }
            }
            places.sort_unstable();
            out.extend(places.into_iter().map(|(_, index)| index));
        }
        out
    }
}

/// Moves the place at `position` up to where it belongs, noting the
/// position of every place it moves.
#[inline]
fn sift_up(heap: &mut [Place], positions: &mut [u32], mut position: usize) {
    let place = heap[position];
    while position > 0 {
        let parent = (position - 1) / 2;
        let above = heap[parent];
        if !place.before(&above) {
            break;
        }
        heap[position] = above;
        positions[above.index as usize] = stored(position);
        position = parent;
    }
    heap[position] = place;
    positions[place.index as usize] = stored(position);
}

/// Moves the hole at `position` down to a leaf, each level's lower child
/// rising into it; the leaf where the hole ends.
#[inline]
fn sink_hole(heap: &mut [Place], positions: &mut [u32], mut position: usize) -> usize {
    let len = heap.len();
    loop {
        let left = 2 * position + 1;
        if left >= len {
            return position;
        }
        let right = left + 1;
        let child = if right < len && heap[right].before(&heap[left]) { right } else { left };
        let below = heap[child];
        heap[position] = below;
        positions[below.index as usize] = stored(position);
        position = child;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::entries::{Entry, Referrers};
    use super::super::keys::Key;
    use super::super::table::Table;
    use super::{rank_of, HeapKey, HeapLanes};

    #[derive(Debug, Clone, Copy, Default)]
    struct Keyed(f64, u64);

    impl HeapKey for Keyed {
        fn heap_key(&self) -> (f64, u64) {
            (self.0, self.1)
        }
    }

    /// Two rising sequences interleaved (an item released once, then one hit
    /// often), with a release below both now and then and removals from
    /// anywhere: the lanes give the lowest key first, as a sorted set does.
    #[test]
    fn the_lowest_key_comes_first_across_both_runs_and_the_heap() {
        let mut entries: Table<Entry<Keyed>> = Table::default();
        let mut lanes: HeapLanes<2> = HeapLanes::default();
        let mut model: [BTreeSet<((i64, u64), u32)>; 2] = [BTreeSet::new(), BTreeSet::new()];
        let mut seed = 0x2545_f491_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for release in 0..4_000_u64 {
            let lane = usize::from(next(8) == 0);
            let priority = match next(10) {
                0 => 0.5,                                                       // below both runs: the heap
                1..=5 => 1.0,                                                   // the run of items released once
                _ => 2.0 + f64::from(u32::try_from(release / 50).unwrap_or(0)), // the run of items hit often
            };
            let index = entries.insert(Entry::new(Key::from(format!("item-{release}").as_str()), release, 1, Referrers::None, 0));
            entries.get_mut(index).meta = Keyed(priority, release);
            lanes.push(&mut entries, lane, index);
            model[lane].insert(((rank_of(priority), release), index));
            if next(3) == 0 {
                // Take back an arbitrary entry, as a hit does.
                let all: Vec<_> = model.iter().enumerate().flat_map(|(l, m)| m.iter().map(move |&k| (l, k))).collect();
                let (l, key) = all[usize::try_from(next(all.len() as u64)).unwrap_or(0)];
                lanes.remove(&mut entries, key.1);
                model[l].remove(&key);
                entries.remove(key.1);
            }
            if next(2) == 0 {
                // Evict, as an allocation that needs room does.
                let expected = model.iter().find_map(|m| m.first().copied());
                assert_eq!(lanes.first(&entries), expected.map(|(_, index)| index), "after release {release}");
                if let Some(key) = expected {
                    let l = usize::from(!model[0].contains(&key));
                    lanes.remove(&mut entries, key.1);
                    model[l].remove(&key);
                    entries.remove(key.1);
                }
            }
        }
        let walked = lanes.walk(&entries);
        let expected: Vec<u32> = model.iter().flat_map(|m| m.iter().map(|&(_, index)| index)).collect();
        assert_eq!(walked, expected);
        assert!(lanes.heaps.iter().any(|heap| !heap.is_empty()), "some releases went to the heap");
    }

    #[test]
    fn ranks_order_as_total_cmp_orders_the_floats() {
        let floats = [f64::NEG_INFINITY, -3.5, -1e-300, -0.0, 0.0, 1e-300, 1.0, 1.0 + f64::EPSILON, 2.5e10, f64::INFINITY];
        for a in floats {
            for b in floats {
                assert_eq!(rank_of(a).cmp(&rank_of(b)), a.total_cmp(&b), "{a} against {b}");
            }
        }
    }
}
