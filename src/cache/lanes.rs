//! The eviction order's storage: lanes of unreferenced entries threaded
//! through the entries' own `links`, so that releasing, taking back and
//! evicting an entry are O(1) (lists) or O(log n) (heaps) with no searching,
//! no stale places and no compaction.

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

/// `N` binary min-heaps of entries; `links[0]` is an entry's position in its heap.
#[derive(Debug, Clone)]
pub(crate) struct HeapLanes<const N: usize> {
    heaps: [Vec<Place>; N],
}

impl<const N: usize> Default for HeapLanes<N> {
    fn default() -> Self {
        Self { heaps: std::array::from_fn(|_| Vec::new()) }
    }
}

impl<const N: usize> HeapLanes<N> {
    pub(crate) fn push<M: HeapKey>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, index: u32) {
        let entry = entries.get_mut(index);
        let (priority, order) = entry.meta.heap_key();
        entry.lane = u8::try_from(lane).unwrap_or(NO_LANE);
        let heap = &mut self.heaps[lane];
        heap.push(Place { priority, order, index });
        let position = heap.len() - 1;
        self.sift_up(entries, lane, position);
    }

    pub(crate) fn remove<M>(&mut self, entries: &mut Table<Entry<M>>, index: u32) {
        let entry = entries.get_mut(index);
        let lane = usize::from(entry.lane);
        let position = entry.links[0] as usize;
        entry.lane = NO_LANE;
        entry.links = [NIL, NIL];
        let heap = &mut self.heaps[lane];
        let last = heap.pop().expect("the entry is in this heap");
        if position < heap.len() {
            heap[position] = last;
            let position = self.sift_down(entries, lane, position);
            self.sift_up(entries, lane, position);
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

    fn settle<M>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, position: usize, place: Place) {
        self.heaps[lane][position] = place;
        entries.get_mut(place.index).links[0] = u32::try_from(position).unwrap_or(NIL);
    }

    /// Moves the place at `position` up to where it belongs; its final position.
    fn sift_up<M>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, mut position: usize) -> usize {
        let place = self.heaps[lane][position];
        while position > 0 {
            let parent = (position - 1) / 2;
            let above = self.heaps[lane][parent];
            if !place.before(&above) {
                break;
            }
            self.settle(entries, lane, position, above);
            position = parent;
        }
        self.settle(entries, lane, position, place);
        position
    }

    /// Moves the place at `position` down to where it belongs; its final position.
    fn sift_down<M>(&mut self, entries: &mut Table<Entry<M>>, lane: usize, mut position: usize) -> usize {
        let len = self.heaps[lane].len();
        let place = self.heaps[lane][position];
        loop {
            let left = 2 * position + 1;
            if left >= len {
                break;
            }
            let heap = &self.heaps[lane];
            let child = if left + 1 < len && heap[left + 1].before(&heap[left]) { left + 1 } else { left };
            let below = heap[child];
            if !below.before(&place) {
                break;
            }
            self.settle(entries, lane, position, below);
            position = child;
        }
        self.settle(entries, lane, position, place);
        position
    }
}
