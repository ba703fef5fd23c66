//! Random operation sequences on the pure-Rust core, with every invariant
//! checked after every operation.
//!
//! `cargo test` runs a modest number of sequences; a long campaign:
//! `PROPTEST_CASES=200000 cargo test --release --test proptest_core`.

use encoder_cache::{CacheState, EncoderCache, EncoderDecoderCache};
use proptest::prelude::*;

const REQUESTS: u8 = 4;
const INPUTS: usize = 6;
const ITEMS: u8 = 6;

#[derive(Debug, Clone)]
enum Op {
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

fn op() -> impl Strategy<Value = Op> {
    let request = 0..REQUESTS;
    let input = 0..INPUTS;
    let item = 0..ITEMS;
    prop_oneof![
        6 => (request.clone(), input.clone(), item.clone())
            .prop_map(|(request, input, item)| Op::CheckAndUpdate { request, input, item }),
        6 => (item.clone(), -4i64..40, -4i64..30)
            .prop_map(|(item, budget, scheduled)| Op::CanAllocate { item, budget, scheduled }),
        8 => (request.clone(), input.clone(), item, proptest::option::weighted(0.1, 0u64..20))
            .prop_map(|(request, input, item, size)| Op::Allocate { request, input, item, size }),
        4 => (request.clone(), input).prop_map(|(request, input)| Op::FreeInput { request, input }),
        2 => request.prop_map(|request| Op::Free { request }),
        2 => Just(Op::TakeFreed),
        1 => Just(Op::Reset),
        1 => Just(Op::Restore),
    ]
}

fn item_name(item: u8) -> String {
    format!("item{item}")
}

fn request_name(request: u8) -> String {
    format!("req{request}")
}

/// Each item's usual size: 1 + 3 * item, so sizes collide only on purpose.
fn item_size(item: u8) -> u64 {
    1 + 3 * u64::from(item)
}

/// Apply `op`; a refused operation must leave the state exactly as it was.
fn apply(cache: &mut EncoderCache, op: &Op) -> Result<(), TestCaseError> {
    let before: CacheState = cache.snapshot();
    match *op {
        Op::CheckAndUpdate { request, input, item } => {
            if cache.check_and_update_cache(&request_name(request), input, &item_name(item)).is_err() {
                prop_assert_eq!(&cache.snapshot(), &before);
            }
        }
        Op::CanAllocate { item, budget, scheduled } => {
            cache.can_allocate(item_size(item), budget, scheduled);
        }
        Op::Allocate { request, input, item, size } => {
            let size = size.unwrap_or(item_size(item));
            if cache.allocate(&request_name(request), input, &item_name(item), size).is_err() {
                prop_assert_eq!(&cache.snapshot(), &before);
            }
        }
        Op::FreeInput { request, input } => cache.free_encoder_input(&request_name(request), input),
        Op::Free { request } => cache.free(&request_name(request)),
        Op::TakeFreed => {
            for item in cache.take_freed() {
                prop_assert!(cache.cached_num_embeds(&item).is_none(), "reported freed but cached: {}", item);
            }
        }
        Op::Reset => cache.reset(),
        Op::Restore => {
            let restored = EncoderCache::restore(&before).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&restored.snapshot(), &before);
            *cache = restored;
        }
    }
    cache.check_invariants().map_err(|e| TestCaseError::fail(format!("after {op:?}: {e}")))
}

proptest! {
    #[test]
    fn invariants_hold_after_every_operation(cache_size in 0u64..48, ops in prop::collection::vec(op(), 1..200)) {
        let mut cache = EncoderCache::new(cache_size);
        for op in &ops {
            apply(&mut cache, op)?;
        }
    }

    /// A restored cache behaves exactly like the original from then on.
    #[test]
    fn restored_cache_behaves_like_the_original(
        cache_size in 0u64..48,
        prefix in prop::collection::vec(op(), 0..100),
        suffix in prop::collection::vec(op(), 1..100),
    ) {
        let mut cache = EncoderCache::new(cache_size);
        for op in &prefix {
            apply(&mut cache, op)?;
        }
        let mut restored = EncoderCache::restore(&cache.snapshot()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for op in &suffix {
            apply(&mut cache, op)?;
            apply(&mut restored, op)?;
            prop_assert_eq!(cache.snapshot(), restored.snapshot());
        }
    }

    /// Any single-field corruption of a valid state is refused by `restore`.
    #[test]
    fn restore_refuses_corrupted_states(
        cache_size in 1u64..48,
        ops in prop::collection::vec(op(), 1..100),
        corruption in 0u8..5,
    ) {
        let mut cache = EncoderCache::new(cache_size);
        for op in &ops {
            apply(&mut cache, op)?;
        }
        let mut state = cache.snapshot();
        match corruption {
            0 => state.num_free_slots += 1,
            1 => state.num_freeable_slots += 1,
            2 => state.cache_size += 1,
            3 => {
                // A referrer that does not hold the item.
                let Some(entry) = state.entries.values_mut().next() else { return Ok(()) };
                entry.referrers.insert("ghost".to_owned());
            }
            _ => {
                let Some(held) = state.requests.values_mut().next() else { return Ok(()) };
                *held.occurrences.values_mut().next().expect("a recorded request counts an item") += 1;
            }
        }
        prop_assert!(EncoderCache::restore(&state).is_err());
    }

    /// The encoder-decoder manager's signed slot count never wraps, whatever
    /// the sizes (vLLM's Python ints are unbounded).
    #[test]
    fn encoder_decoder_slot_count_is_exact(
        cache_size in prop_oneof![0u64..48, Just(u64::MAX)],
        ops in prop::collection::vec((any::<bool>(), prop_oneof![0u64..20, Just(u64::MAX)]), 1..50),
    ) {
        let mut cache = EncoderDecoderCache::new(cache_size);
        let mut expected = i128::from(cache_size);
        for (allocate, size) in ops {
            if allocate {
                cache.allocate("item".into(), size);
                expected -= i128::from(size);
            } else {
                cache.free_encoder_input(size);
                expected += i128::from(size);
            }
            prop_assert_eq!(cache.num_free_slots(), expected);
        }
    }
}
