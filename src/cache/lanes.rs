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

/// A heap place: the entry's key, kept beside its slot so that sifting reads no entry.
#[derive(Debug, Clone, Copy)]
struct Place {
    priority: f64,
    order: u64,
    index: u32,
}

impl Place {
    fn before(&self, other: &Place) -> bool {
        self.priority.total_cmp(&other.priority).then(self.order.cmp(&other.order)).is_lt()
    }
}

/// `N` binary min-heaps of entries. Each entry's position in its heap is
/// kept here, by entry index, so that sifting touches no entry.
#[derive(Debug, Clone)]
pub(crate) struct HeapLanes<const N: usize> {
    heaps: [Vec<Place>; N],
    /// Heap position by entry index (meaningful while the entry is in a heap).
    positions: Vec<u32>,
}

impl<const N: usize> Default for HeapLanes<N> {
    fn default() -> Self {
        Self { heaps: std::array::from_fn(|_| Vec::new()), positions: Vec::new() }
    }
}

/// A heap position as stored; a cache holds far fewer than 2^32 entries.
#[inline]
fn stored(position: usize) -> u32 {
    u32::try_from(position).unwrap_or(NIL)
}

impl<const N: usize> HeapLanes<N> {
    pub(crate) fn push<M: HeapKey>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, index: u32) {
        let entry = entries.get_mut(index);
        let (priority, order) = entry.meta.heap_key();
        entry.lane = u8::try_from(lane).unwrap_or(NO_LANE);
        if self.positions.len() <= index as usize {
            self.positions.resize(index as usize + 1, NIL);
        }
        let heap = &mut self.heaps[lane];
        heap.push(Place { priority, order, index });
        let last = heap.len() - 1;
        sift_up(heap, &mut self.positions, last);
    }

    pub(crate) fn remove<M>(&mut self, entries: &mut Table<Entry<M>>, index: u32) {
        let entry = entries.get_mut(index);
        let lane = usize::from(entry.lane);
        entry.lane = NO_LANE;
        let position = self.positions[index as usize] as usize;
        let heap = &mut self.heaps[lane];
        let last = heap.pop().expect("the entry is in this heap");
        if position < heap.len() {
            // Floyd's removal: the hole sinks to a leaf along the lower
            // children (one comparison a level), then the last place fills
            // it and rises as far as it must.
            let leaf = sink_hole(heap, &mut self.positions, position);
            heap[leaf] = last;
            sift_up(heap, &mut self.positions, leaf);
        }
    }

    /// The first non-empty lane's lowest entry.
    pub(crate) fn first(&self) -> Option<u32> {
        self.heaps.iter().find_map(|heap| heap.first().map(|place| place.index))
    }

    /// Every lane's entries, lane by lane, lowest first.
    pub(crate) fn walk<M>(&self, _entries: &Table<Entry<M>>) -> Vec<u32> {
        let mut out = Vec::new();
        for heap in &self.heaps {
            let mut sorted = heap.clone();
            sorted.sort_by(|a, b| a.priority.total_cmp(&b.priority).then(a.order.cmp(&b.order)));
            out.extend(sorted.into_iter().map(|place| place.index));
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
