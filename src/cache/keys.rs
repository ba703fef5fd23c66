//! How items and requests are named and found: [`Key`] (a shared string),
//! the 64-bit hash every table and the ghost memory use, [`Handle`]s into the
//! slabs, and [`KeyArg`], the way a caller names one.

use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};

use hashbrown::DefaultHashBuilder;

/// An item identifier (vLLM's `mm_hash`) or a request id, shared rather than copied.
pub type Key = Arc<str>;

/// The hash of an identifier or request id. One randomly seeded hasher per
/// process, so a hash a caller keeps stays valid for every cache.
pub fn hash_key(text: &str) -> u64 {
    static HASHER: OnceLock<DefaultHashBuilder> = OnceLock::new();
    HASHER.get_or_init(DefaultHashBuilder::default).hash_one(text)
}

/// A slot of a slab and the generation it had when the handle was given: a
/// handle whose slot was freed since (and perhaps reused) no longer matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// The handles of a request and of the item it now holds, as an allocation
/// leaves them, for the caller to name both by in later calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    pub request: Handle,
    pub item: Handle,
}

/// A request id or identifier as the core's methods take it: its text, and
/// optionally what the caller already knows of it: the [`Key`] it holds (shared
/// when the core keeps it), its [`hash_key`] (so it is not hashed again) and
/// the [`Handle`] the core last had it under (so a valid one is not even
/// looked up).
#[derive(Clone, Copy, Debug)]
pub struct KeyArg<'a> {
    text: &'a str,
    held: Option<&'a Key>,
    hash: Option<u64>,
    handle: Option<Handle>,
}

impl<'a> From<&'a str> for KeyArg<'a> {
    fn from(text: &'a str) -> Self {
        Self { text, held: None, hash: None, handle: None }
    }
}

impl<'a> From<&'a String> for KeyArg<'a> {
    fn from(text: &'a String) -> Self {
        Self::from(text.as_str())
    }
}

impl<'a> From<&'a Key> for KeyArg<'a> {
    fn from(key: &'a Key) -> Self {
        Self { text: key, held: Some(key), hash: None, handle: None }
    }
}

impl<'a> KeyArg<'a> {
    /// `key`, whose [`hash_key`] is `hash`.
    pub fn hashed(key: &'a Key, hash: u64) -> Self {
        Self { text: key, held: Some(key), hash: Some(hash), handle: None }
    }

    /// The same name, last seen by the core under `handle`.
    #[must_use]
    pub fn at(self, handle: Option<Handle>) -> Self {
        Self { handle, ..self }
    }

    pub fn as_str(&self) -> &'a str {
        self.text
    }

    pub fn hash(&self) -> u64 {
        self.hash.unwrap_or_else(|| hash_key(self.text))
    }

    pub(crate) fn handle(&self) -> Option<Handle> {
        self.handle
    }

    /// Whether this names `key`: by pointer first, then by text.
    pub(crate) fn names(&self, key: &Key) -> bool {
        self.held.is_some_and(|held| Arc::ptr_eq(held, key)) || self.text == &**key
    }

    /// The key to keep: the caller's, shared, or a new one.
    pub(crate) fn to_key(self) -> Key {
        self.held.cloned().unwrap_or_else(|| Key::from(self.text))
    }
}
