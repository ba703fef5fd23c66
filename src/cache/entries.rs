//! Cached items: an [`Entry`] per item in the entries table, with the
//! requests that reference it (by their slot in the requests table) and the
//! links of its place in the eviction order while it is unreferenced.

use hashbrown::HashSet;

use super::keys::Key;
use super::table::Named;

/// No slot: the end of a list, or no lane.
pub(crate) const NIL: u32 = u32::MAX;

/// A cached item.
#[derive(Debug, Clone)]
pub struct Entry<M> {
    pub(crate) key: Key,
    pub(crate) hash: u64,
    pub num_embeds: u64,
    /// The requests referencing it, by request slot.
    pub(crate) referrers: Referrers,
    /// The modality tag given at allocation (0 = unknown).
    pub modality: u8,
    /// While unreferenced, the lane of the eviction order holding it; [`NO_LANE`] while referenced.
    pub(crate) lane: u8,
    /// Its neighbours in a list lane, or its position in a heap lane.
    pub(crate) links: [u32; 2],
    /// What the policy keeps about it.
    pub(crate) meta: M,
}

/// The lane of a referenced entry.
pub(crate) const NO_LANE: u8 = u8::MAX;

impl<M: Default> Entry<M> {
    pub(crate) fn new(key: Key, hash: u64, num_embeds: u64, referrers: Referrers, modality: u8) -> Self {
        Self { key, hash, num_embeds, referrers, modality, lane: NO_LANE, links: [NIL, NIL], meta: M::default() }
    }
}

impl<M> Entry<M> {
    pub fn key(&self) -> &Key {
        &self.key
    }

    pub fn is_referenced(&self) -> bool {
        !self.referrers.is_empty()
    }
}

impl<M> Named for Entry<M> {
    fn key(&self) -> &Key {
        &self.key
    }

    fn hash(&self) -> u64 {
        self.hash
    }
}

/// The requests referencing an entry, by request slot. Most entries have at
/// most one, kept inline; an item shared by several requests (one image in
/// many chats) moves to a boxed set. Always in the smallest variant that fits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Referrers {
    #[default]
    None,
    One(u32),
    Many(Box<HashSet<u32>>),
}

impl Referrers {
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(_) => 1,
            Self::Many(set) => set.len(),
        }
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, request: u32) -> bool {
        match self {
            Self::None => false,
            Self::One(one) => *one == request,
            Self::Many(set) => set.contains(&request),
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let (one, many) = match self {
            Self::None => (None, None),
            Self::One(one) => (Some(*one), None),
            Self::Many(set) => (None, Some(set.iter().copied())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// Adds `request`; false if it was already there.
    pub(crate) fn insert(&mut self, request: u32) -> bool {
        match self {
            Self::None => *self = Self::One(request),
            Self::One(one) if *one == request => return false,
            Self::One(one) => *self = Self::Many(Box::new(HashSet::from_iter([*one, request]))),
            Self::Many(set) => return set.insert(request),
        }
        true
    }

    /// Removes `request`; false if it was not there.
    pub(crate) fn remove(&mut self, request: u32) -> bool {
        match self {
            Self::None => false,
            Self::One(one) => {
                let found = *one == request;
                if found {
                    *self = Self::None;
                }
                found
            }
            Self::Many(set) => {
                let found = set.remove(&request);
                if set.len() == 1 {
                    let last = set.iter().next().copied().unwrap_or(NIL);
                    *self = Self::One(last);
                }
                found
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn referrers_stay_in_their_smallest_form() {
        let mut referrers = Referrers::default();
        assert!(referrers.insert(1));
        assert!(!referrers.insert(1));
        assert!(referrers.insert(2));
        assert!(referrers.insert(3));
        assert_eq!((referrers.len(), referrers.contains(2), referrers.contains(9)), (3, true, false));
        assert!(referrers.remove(1) && referrers.remove(3));
        assert_eq!(referrers, Referrers::One(2), "back inline with one left");
        assert!(!referrers.remove(1));
        assert!(referrers.remove(2) && referrers.is_empty());
    }
}
