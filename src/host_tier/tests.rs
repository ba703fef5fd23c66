//! Tests of the host tier's block cache: vLLM's allocation and FIFO order,
//! the other policies' victims, refusals that change nothing, and the
//! bookkeeping's rules under long random sequences.
#![allow(clippy::float_cmp)]

use std::convert::Infallible;

use super::*;
use crate::test_rng::Rng;

type Cache = HostBlockCache<()>;

fn alloc(cache: &mut Cache, key: &str, n: usize) -> Option<Vec<u32>> {
    cache.alloc::<Infallible>(key, n, n as u64, |_| Ok(())).unwrap().map(|e| e.blocks.to_vec())
}

fn ready(cache: &mut Cache, key: &str, n: usize) -> Vec<u32> {
    let blocks = alloc(cache, key, n).expect("fits");
    cache.mark_ready(key).unwrap();
    blocks
}

fn keys(cache: &Cache) -> Vec<&str> {
    let mut keys: Vec<&str> = cache.entries().map(|e| e.key).collect();
    keys.sort_unstable();
    keys
}

#[test]
fn names_round_trip_and_fifo_is_the_default() {
    assert_eq!(HostPolicy::NAMES, ["fifo", "gdsf", "s3fifo"]);
    for (policy, name) in HostPolicy::ALL.into_iter().zip(HostPolicy::NAMES) {
        assert_eq!((policy.name(), HostPolicy::from_name(name)), (*name, Some(policy)));
    }
    assert_eq!(HostPolicy::from_name("vllm"), None);
    assert_eq!(HostPolicy::default(), HostPolicy::Fifo);
}

#[test]
fn sizes_beyond_u32_are_refused() {
    assert!(Cache::try_new(u32::MAX as usize + 1, HostPolicy::Fifo).is_none());
    assert_eq!(Cache::try_new(0, HostPolicy::Fifo).unwrap().num_blocks(), 0);
}

#[test]
fn blocks_come_from_the_top_of_the_stack_in_ascending_order() {
    let mut cache = Cache::try_new(8, HostPolicy::Fifo).unwrap();
    assert_eq!(alloc(&mut cache, "a", 3), Some(vec![5, 6, 7]));
    assert_eq!(alloc(&mut cache, "b", 2), Some(vec![3, 4]));
    cache.discard("a").unwrap();
    assert_eq!(cache.free_blocks(), [0, 1, 2, 5, 6, 7]);
    assert_eq!(alloc(&mut cache, "c", 4), Some(vec![2, 5, 6, 7]));
    assert_eq!(alloc(&mut cache, "empty", 0), Some(vec![]));
    cache.check_invariants().unwrap();
}

#[test]
fn fifo_evicts_in_the_order_entries_became_evictable() {
    let mut cache = Cache::try_new(6, HostPolicy::Fifo).unwrap();
    ready(&mut cache, "a", 2);
    ready(&mut cache, "b", 2);
    ready(&mut cache, "c", 2);
    cache.pin("a").unwrap();
    cache.unpin("a").unwrap(); // a is evictable again, now after c
    assert_eq!(cache.eviction_order(), ["b", "c", "a"]);
    assert_eq!(alloc(&mut cache, "d", 3).map(|b| b.len()), Some(3));
    assert_eq!(keys(&cache), ["a", "d"], "b and c went, in that order");
    assert_eq!(cache.stats().evictions, 2);
    cache.check_invariants().unwrap();
}

#[test]
fn a_failing_alloc_evicts_nothing_and_held_entries_stay() {
    let mut cache = Cache::try_new(4, HostPolicy::Fifo).unwrap();
    ready(&mut cache, "a", 2);
    alloc(&mut cache, "writing", 1);
    cache.pin("a").unwrap();
    assert!(cache.has_held_entries());
    assert_eq!(alloc(&mut cache, "big", 2), None, "one free block, nothing evictable");
    assert_eq!(keys(&cache), ["a", "writing"]);
    assert_eq!(cache.stats().alloc_failures, 1);
    cache.unpin("a").unwrap();
    assert_eq!(alloc(&mut cache, "big", 2).map(|b| b.len()), Some(2));
    assert_eq!(keys(&cache), ["big", "writing"]);
}

#[test]
fn refusals_change_nothing() {
    let mut cache = Cache::try_new(4, HostPolicy::Fifo).unwrap();
    ready(&mut cache, "a", 1);
    alloc(&mut cache, "w", 1);
    let before = (cache.free_blocks().to_vec(), cache.eviction_order().join(","), cache.stats(), cache.has_held_entries());
    let err = |r: Result<HostEntry<'_, ()>, HostCacheError>| r.err();
    assert!(matches!(cache.alloc::<Infallible>("a", 1, 1, |_| Ok(())), Err(AllocError::Refused(HostCacheError::Duplicate { .. }))));
    assert!(matches!(cache.alloc::<Infallible>("x", 5, 5, |_| Ok(())), Err(AllocError::Refused(HostCacheError::TooLarge { .. }))));
    assert_eq!(err(cache.mark_ready("a")), Some(HostCacheError::AlreadyReady { key: "a".into() }));
    assert_eq!(err(cache.mark_ready("nope")), Some(HostCacheError::UnknownKey { key: "nope".into() }));
    assert_eq!(err(cache.pin("w")), Some(HostCacheError::NotReady { key: "w".into() }));
    assert_eq!(err(cache.unpin("a")), Some(HostCacheError::NotPinned { key: "a".into() }));
    assert_eq!(cache.discard("a"), Err(HostCacheError::NotDiscardable { key: "a".into() }));
    let after = (cache.free_blocks().to_vec(), cache.eviction_order().join(","), cache.stats(), cache.has_held_entries());
    assert_eq!(before, after);
    assert_eq!(cache.pin_if_ready("w").map(|e| e.pins), Some(-1), "a not-ready entry is returned unpinned");
    assert!(cache.pin_if_ready("nope").is_none());
}

#[test]
fn a_failing_payload_puts_the_blocks_back() {
    let mut cache = Cache::try_new(4, HostPolicy::Fifo).unwrap();
    let free = cache.free_blocks().to_vec();
    assert_eq!(cache.alloc("a", 3, 3, |_| Err("no memory")).err(), Some(AllocError::Payload("no memory")));
    assert_eq!(cache.free_blocks(), free);
    assert!(cache.is_empty());
}

#[test]
fn gdsf_keeps_the_loaded_and_the_costly_per_block() {
    let mut cache = Cache::try_new(100, HostPolicy::Gdsf).unwrap();
    ready(&mut cache, "once", 10);
    ready(&mut cache, "loaded", 10);
    ready(&mut cache, "big", 60);
    cache.pin("loaded").unwrap();
    cache.unpin("loaded").unwrap(); // frequency 2
                                    // once and big have frequency 1; big costs more per block (attention is quadratic).
    assert_eq!(cache.eviction_order(), ["once", "big", "loaded"]);
    alloc(&mut cache, "new", 30);
    assert_eq!(keys(&cache), ["big", "loaded", "new"]);
    assert_eq!(cache.clock(), HostPolicy::gdsf_cost_per_block(10, 10), "the clock rose to the victim's priority");
}

#[test]
fn s3fifo_evicts_never_loaded_entries_first_and_main_goes_round() {
    let mut cache = Cache::try_new(6, HostPolicy::S3Fifo).unwrap();
    ready(&mut cache, "hot", 2);
    cache.pin("hot").unwrap();
    cache.unpin("hot").unwrap(); // main lane, one credit
    ready(&mut cache, "cold1", 2);
    ready(&mut cache, "cold2", 2);
    assert_eq!(cache.eviction_order(), ["cold1", "cold2", "hot"]);
    alloc(&mut cache, "x", 4);
    assert_eq!(keys(&cache), ["hot", "x"]);
    cache.mark_ready("x").unwrap();
    // Small holds x; it goes before hot even though hot is older.
    alloc(&mut cache, "y", 4);
    assert_eq!(keys(&cache), ["hot", "y"]);
    cache.mark_ready("y").unwrap();
    cache.pin("y").unwrap();
    cache.unpin("y").unwrap();
    // Both in main: hot spends its credit and goes round, y spends its, hot goes.
    alloc(&mut cache, "z", 2);
    assert_eq!(keys(&cache), ["y", "z"]);
    cache.check_invariants().unwrap();
}

#[test]
fn every_policy_keeps_its_rules_over_long_random_sequences() {
    for policy in HostPolicy::ALL {
        let mut cache = Cache::try_new(40, policy).unwrap();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for step in 0..20_000 {
            let key = format!("k{}", rng.below(30));
            // Unpins twice as often as pins, so pins do not pile up.
            match rng.below(7) {
                0 | 1 => {
                    let _ = cache.alloc::<Infallible>(&key, rng.below(12), 3, |_| Ok(()));
                }
                2 => {
                    let _ = cache.mark_ready(&key);
                }
                3 => {
                    let _ = cache.pin_if_ready(&key);
                }
                4 | 5 => {
                    let _ = cache.unpin(&key);
                }
                _ => {
                    let _ = cache.discard(&key);
                }
            }
            if step % 97 == 0 {
                cache.check_invariants().unwrap_or_else(|e| panic!("{policy} at step {step}: {e}"));
            }
        }
        cache.check_invariants().unwrap();
        assert!(cache.stats().evictions > 100, "{policy}: the sequence must evict: {:?}", cache.stats());
    }
}
