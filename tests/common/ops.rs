//! Scheduler-like operations on the core and the checks run after each one,
//! shared by the property tests (tests/proptest_core.rs) and the cargo-fuzz
//! target (fuzz/fuzz_targets/core_ops.rs), which only differ in how they
//! generate operation sequences.

use encoder_cache::cache::{Key, Policy};
use encoder_cache::step::{allocate_inputs, free_inputs_before, try_schedule};
use encoder_cache::{EncoderCache, Item, StepArgs, StepError};

pub const REQUESTS: u8 = 4;
pub const INPUTS: usize = 6;
pub const ITEMS: u8 = 6;

#[derive(Debug, Clone)]
pub enum Op {
    CheckAndUpdate {
        request: u8,
        input: usize,
        item: u8,
    },
    CanAllocate {
        item: u8,
        budget: i64,
        scheduled: i64,
    },
    /// `size` overrides the item's usual size (a request that disagrees with the cache).
    Allocate {
        request: u8,
        input: usize,
        item: u8,
        size: Option<u64>,
    },
    FreeInput {
        request: u8,
        input: usize,
    },
    Free {
        request: u8,
    },
    TakeFreed,
    /// The step-level API: schedule tokens `[computed, computed + new_tokens)`
    /// of the request, then allocate what the step chose.
    Step {
        request: u8,
        computed: i64,
        new_tokens: i64,
        budget: i64,
    },
    FreeBefore {
        request: u8,
        position: i64,
    },
    Reset,
    /// Replace the cache by one restored from its snapshot.
    Restore,
    /// Mark waiting request `request` as needing the items in bit mask `items`.
    Mark {
        request: u8,
        items: u8,
    },
    Unmark {
        request: u8,
    },
    Resize {
        size: u64,
    },
}

/// Every policy, for the generators to pick from.
pub const POLICIES: [Policy; 6] = Policy::ALL;

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

/// The request's items as the step-level API sees them: item `(2r + k) % 4`
/// at input `k` (so items repeat within a request), 20 tokens apart. The
/// per-item operations may have cached other items at those inputs, which the
/// step must refuse cleanly.
fn items(request: u8) -> Vec<Item> {
    (0u8..)
        .take(INPUTS)
        .map(|input| {
            let item = (2 * request + input) % 4;
            Item::new(item_name(item).into(), 20 * u64::from(input), item_size(item), item_size(item), None).with_modality(item % 3)
        })
        .collect()
}

/// Apply `op`, then check every invariant; a refused operation must leave the
/// state exactly as it was, and restoring a snapshot must reproduce it.
pub fn apply(cache: &mut EncoderCache, op: &Op) -> Result<(), String> {
    let before = cache.snapshot();
    let policy_before = cache.policy_snapshot();
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
            cache.allocate_tagged(&request_name(request), input, item_name(item).as_str(), size, item % 3).is_err()
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
        Op::Step { request, computed, new_tokens, budget } => {
            // Hits taken before a refused item stay, as in vLLM's loop: only soundness is checked.
            let (id, items) = (request_name(request), items(request));
            let args = StepArgs {
                num_computed_tokens: computed,
                num_new_tokens: new_tokens,
                encoder_compute_budget: budget,
                shift_computed_tokens: 0,
                disable_chunked_mm_input: computed % 2 == 0,
            };
            let remote = |key: &encoder_cache::Key| Ok::<bool, StepError>(key.ends_with('5'));
            if let Ok(out) = try_schedule(cache, &id, items.as_slice(), args, &mut { remote }) {
                let _ = allocate_inputs(cache, &id, items.as_slice(), &out.to_encode, &out.repeated);
            }
            false
        }
        Op::FreeBefore { request, position } => {
            let _ = free_inputs_before(cache, &request_name(request), items(request).as_slice(), position, false);
            false
        }
        Op::Reset => {
            cache.reset();
            false
        }
        Op::Restore => {
            *cache = EncoderCache::restore_with(&before, &policy_before).map_err(|e| format!("a valid snapshot was refused: {e}"))?;
            cache.snapshot() != before || cache.policy_snapshot() != policy_before
        }
        Op::Mark { request, items } => {
            let identifiers = (0..ITEMS).filter(|k| items & (1 << k) != 0).map(|k| Key::from(item_name(k)));
            cache.mark_waiting(format!("wait{request}").as_str(), identifiers).is_err()
        }
        Op::Unmark { request } => cache.unmark_waiting(format!("wait{request}").as_str()).is_err(),
        Op::Resize { size } => {
            let refused = cache.resize(size).is_err();
            if !refused && cache.cache_size() != size {
                return Err(format!("resized to {size} but the cache holds {}", cache.cache_size()));
            }
            refused
        }
    };
    if refused && (cache.snapshot() != before || cache.policy_snapshot() != policy_before) {
        return Err(format!("{op:?} was refused or failed but changed the state"));
    }
    cache.check_invariants().map_err(|e| format!("after {op:?}: {e}"))
}
