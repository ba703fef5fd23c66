//! Scheduler-like operations on the core and the checks run after each one,
//! shared by the property tests (tests/proptest_core.rs) and the cargo-fuzz
//! target (fuzz/fuzz_targets/core_ops.rs), which only differ in how they
//! generate operation sequences.

use encoder_cache::EncoderCache;

pub const REQUESTS: u8 = 4;
pub const INPUTS: usize = 6;
pub const ITEMS: u8 = 6;

#[derive(Debug, Clone)]
pub enum Op {
    CheckAndUpdate { request: u8, input: usize, item: u8 },
    CanAllocate { item: u8, budget: i64, scheduled: i64 },
    /// `size` overrides the item's usual size (a request that disagrees with the cache).
    Allocate { request: u8, input: usize, item: u8, size: Option<u64> },
    FreeInput { request: u8, input: usize },
    Free { request: u8 },
    TakeFreed,
    Reset,
    /// Replace the cache by one restored from its snapshot.
    Restore,
}

fn item_name(item: u8) -> String {
    format!("item{item}")
}

fn request_name(request: u8) -> String {
    format!("req{request}")
}

/// Each item's usual size: 1 + 3 * item, so sizes collide only on purpose.
pub fn item_size(item: u8) -> u64 {
    1 + 3 * u64::from(item)
}

/// Apply `op`, then check every invariant; a refused operation must leave the
/// state exactly as it was, and restoring a snapshot must reproduce it.
pub fn apply(cache: &mut EncoderCache, op: &Op) -> Result<(), String> {
    let before = cache.snapshot();
    let refused = match *op {
        Op::CheckAndUpdate { request, input, item } => {
            cache.check_and_update_cache(&request_name(request), input, &item_name(item)).is_err()
        }
        Op::CanAllocate { item, budget, scheduled } => {
            cache.can_allocate(item_size(item), budget, scheduled);
            false
        }
        Op::Allocate { request, input, item, size } => {
            let size = size.unwrap_or(item_size(item));
            cache.allocate(&request_name(request), input, &item_name(item), size).is_err()
        }
        Op::FreeInput { request, input } => {
            cache.free_encoder_input(&request_name(request), input);
            false
        }
        Op::Free { request } => {
            cache.free(&request_name(request));
            false
        }
        Op::TakeFreed => {
            if let Some(item) = cache.take_freed().into_iter().find(|item| cache.cached_num_embeds(item).is_some()) {
                return Err(format!("{item} reported freed but still cached"));
            }
            false
        }
        Op::Reset => {
            cache.reset();
            false
        }
        Op::Restore => {
            *cache = EncoderCache::restore(&before).map_err(|e| format!("a valid snapshot was refused: {e}"))?;
            cache.snapshot() != before
        }
    };
    if refused && cache.snapshot() != before {
        return Err(format!("{op:?} was refused or failed but changed the state"));
    }
    cache.check_invariants().map_err(|e| format!("after {op:?}: {e}"))
}
