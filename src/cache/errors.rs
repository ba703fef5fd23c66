//! Why an operation was refused. A refused operation changes nothing.

/// Why an operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheError {
    /// `allocate` for an item that is already cached: the scheduler must take
    /// the cache hit (`check_and_update_cache`) instead of reserving space twice.
    AlreadyCached { identifier: String },
    /// `allocate` without the room `can_allocate` would have made.
    InsufficientSpace { identifier: String, needed: u64, free: u64, freeable: u64 },
    /// A cached item was offered with a different embedding count.
    EmbedCountMismatch { identifier: String, cached: u64, requested: u64 },
    /// The request already holds this input position as another item (its
    /// `mm_features` changed under a held input). Counting the new item there
    /// would leave a reference that no free could ever release.
    InputHeld { request_id: String, input_id: usize, held: String, given: String },
    /// `resize` below what the referenced entries (or held inputs) alone take.
    ReferencedExceedSize { cache_size: u64, referenced: u64 },
    /// An encoder-decoder `allocate` for an input the request holds already.
    InputAllocated { request_id: String, input_id: usize },
    /// `mark_waiting` for a request already marked.
    AlreadyWaiting { request_id: String },
    /// `unmark_waiting` for a request not marked.
    NotWaiting { request_id: String },
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyCached { identifier } => {
                write!(f, "item {identifier:?} is already cached; take the hit with check_and_update_cache instead of allocating it again")
            }
            Self::InsufficientSpace { identifier, needed, free, freeable } => write!(
                f,
                "cannot allocate {needed} embeddings for item {identifier:?}: {free} slots free, \
                 {freeable} reclaimable; call can_allocate first so it can evict"
            ),
            Self::EmbedCountMismatch { identifier, cached, requested } => {
                write!(f, "item {identifier:?} is cached with {cached} embeddings but the request gives {requested}")
            }
            Self::InputHeld { request_id, input_id, held, given } => write!(
                f,
                "request '{request_id}' already holds input {input_id} as item '{held}', not '{given}'; \
                 free that input before reusing its id"
            ),
            Self::ReferencedExceedSize { cache_size, referenced } => write!(
                f,
                "cannot resize the cache to {cache_size} embeddings: entries in use take {referenced}; \
                 free requests first or choose a size of at least {referenced}"
            ),
            Self::InputAllocated { request_id, input_id } => {
                write!(f, "request '{request_id}' already holds input {input_id}; free it before allocating it again")
            }
            Self::AlreadyWaiting { request_id } => write!(f, "request '{request_id}' is already marked waiting"),
            Self::NotWaiting { request_id } => write!(f, "request '{request_id}' is not marked waiting"),
        }
    }
}

impl std::error::Error for CacheError {}
