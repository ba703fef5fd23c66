//! Random operation sequences on the pure-Rust core, with every invariant
//! checked after every operation.
//!
//! `cargo test` runs a modest number of sequences; a long campaign:
//! `PROPTEST_CASES=200000 cargo test --release --test proptest_core`.

mod common;

use common::ops::{apply, Op, INPUTS, ITEMS, POLICIES, REQUESTS};
use encoder_cache::cache::Policy;
use encoder_cache::{EncoderCache, EncoderDecoderCache};
use proptest::prelude::*;

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
        2 => request.clone().prop_map(|request| Op::Free { request }),
        2 => Just(Op::TakeFreed),
        4 => (request.clone(), 0i64..130, 0i64..70, -4i64..40)
            .prop_map(|(request, computed, new_tokens, budget)| Op::Step { request, computed, new_tokens, budget }),
        2 => (request, 0i64..130).prop_map(|(request, position)| Op::FreeBefore { request, position }),
        1 => Just(Op::Reset),
        1 => Just(Op::Restore),
        2 => (0..REQUESTS, any::<u8>()).prop_map(|(request, items)| Op::Mark { request, items }),
        2 => (0..REQUESTS).prop_map(|request| Op::Unmark { request }),
        1 => (0u64..48).prop_map(|size| Op::Resize { size }),
    ]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop::sample::select(POLICIES.to_vec())
}

fn run(cache: &mut EncoderCache, ops: &[Op]) -> Result<(), TestCaseError> {
    ops.iter().try_for_each(|op| apply(cache, op).map_err(TestCaseError::fail))
}

proptest! {
    #[test]
    fn invariants_hold_after_every_operation(
        cache_size in 0u64..48,
        policy in policy(),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(&mut EncoderCache::with_policy(cache_size, policy), &ops)?;
    }

    /// A restored cache behaves exactly like the original from then on
    /// (under the policies whose whole state a snapshot holds: lfu-ghost's
    /// memory of evicted counts, arc's ghost lists and duel's shadow caches
    /// are not in it).
    #[test]
    fn restored_cache_behaves_like_the_original(
        cache_size in 0u64..48,
        policy in policy(),
        prefix in prop::collection::vec(op(), 0..100),
        suffix in prop::collection::vec(op(), 1..100),
    ) {
        prop_assume!(!matches!(policy, Policy::GhostLfu | Policy::Arc | Policy::Duel));
        let mut cache = EncoderCache::with_policy(cache_size, policy);
        run(&mut cache, &prefix)?;
        let mut restored = EncoderCache::restore_with(&cache.snapshot(), &cache.policy_snapshot())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for op in &suffix {
            run(&mut cache, std::slice::from_ref(op))?;
            run(&mut restored, std::slice::from_ref(op))?;
            prop_assert_eq!(cache.snapshot(), restored.snapshot());
            prop_assert_eq!(cache.policy_snapshot(), restored.policy_snapshot());
        }
    }

    /// Any single-field corruption of a valid state is refused by `restore`.
    #[test]
    fn restore_refuses_corrupted_states(
        cache_size in 1u64..48,
        policy in policy(),
        ops in prop::collection::vec(op(), 1..100),
        corruption in 0u8..7,
    ) {
        let mut cache = EncoderCache::with_policy(cache_size, policy);
        run(&mut cache, &ops)?;
        let mut state = cache.snapshot();
        let mut policy_state = cache.policy_snapshot();
        match corruption {
            0 => state.num_free_slots += 1,
            1 => state.num_freeable_slots += 1,
            2 => state.cache_size += 1,
            3 => {
                // A referrer that does not hold the item.
                let Some(entry) = state.entries.values_mut().next() else { return Ok(()) };
                entry.referrers.insert("ghost".to_owned());
            }
            4 => {
                let Some(held) = state.requests.values_mut().next() else { return Ok(()) };
                *held.occurrences.values_mut().next().expect("a recorded request counts an item") += 1;
            }
            5 => {
                // A waiting mark on the first evictable entry, ahead of the unmarked ones.
                let needed: std::collections::BTreeSet<&String> = policy_state.waiting.values().flatten().collect();
                let Some(pos) = state.freeable.iter().position(|(item, _)| !needed.contains(item)) else { return Ok(()) };
                if state.freeable[pos + 1..].iter().all(|(item, _)| needed.contains(item)) { return Ok(()) }
                let item = state.freeable[pos].0.clone();
                policy_state.waiting.insert("ghost".to_owned(), vec![item]);
            }
            _ => {
                // Frequency zero, or a rank on a referenced entry.
                let Some((item, meta)) = policy_state.entries.iter_mut().next() else { return Ok(()) };
                if state.entries[item].referrers.is_empty() { meta.frequency = 0 } else { meta.rank = 1.0 }
            }
        }
        prop_assert!(EncoderCache::restore_with(&state, &policy_state).is_err());
    }

    /// The encoder-decoder manager frees each held input once: its free
    /// slots and held sizes always add up to `cache_size`, whatever the calls.
    #[test]
    fn encoder_decoder_frees_each_input_once(
        cache_size in prop_oneof![0u64..48, Just(u64::MAX)],
        ops in prop::collection::vec((0u8..3, 0usize..3, 0usize..4, prop_oneof![0u64..20, Just(u64::MAX)]), 1..60),
    ) {
        let mut cache = EncoderDecoderCache::new(cache_size);
        let mut held: std::collections::BTreeMap<(usize, usize), u64> = std::collections::BTreeMap::new();
        for (op, request, input_id, size) in ops {
            let request_id = format!("r{request}");
            match op {
                0 => {
                    let fits = size <= cache.num_free_slots() && !held.contains_key(&(request, input_id));
                    prop_assert_eq!(cache.allocate(request_id.as_str(), input_id, "item".into(), size).is_ok(), fits);
                    if fits {
                        held.insert((request, input_id), size);
                    }
                }
                1 => {
                    let was_held = held.remove(&(request, input_id)).is_some();
                    prop_assert_eq!(cache.free_encoder_input(request_id.as_str(), input_id), was_held);
                }
                _ => {
                    cache.free(request_id.as_str());
                    held.retain(|(r, _), _| *r != request);
                }
            }
            let held_total: u128 = held.values().map(|&n| u128::from(n)).sum();
            prop_assert_eq!(u128::from(cache.num_free_slots()) + held_total, u128::from(cache_size));
            prop_assert!(cache.check_invariants().is_ok());
        }
    }
}
