//! The core's operations, policy by policy where it matters.

use std::sync::Arc;

use super::*;

fn freeable(cache: &EncoderCache) -> Vec<(&str, u64)> {
    cache.freeable().into_iter().map(|(k, n)| (&**k, n)).collect()
}

#[test]
fn a_repeated_item_is_held_until_its_last_occurrence_is_freed() {
    let mut cache = EncoderCache::new(8);
    cache.allocate("r1", 0, "imgA", 4).unwrap();
    assert_eq!(cache.check_and_update_cache("r1", 1, "imgA"), Ok(true));
    cache.free_encoder_input("r1", 0);
    assert_eq!(cache.num_freeable_slots(), 4);
    assert!(!cache.can_allocate(8, 1_000_000, 0), "imgA is still needed and must not be evicted");
    cache.free_encoder_input("r1", 1);
    assert_eq!(freeable(&cache), vec![("imgA", 4)]);
    assert!((cache.num_requests() == 0));
}

#[test]
fn a_handle_and_a_count_of_changes_name_each_state_of_a_requests_holdings() {
    let mut cache = EncoderCache::new(16);
    let state =
        |cache: &EncoderCache| cache.held_inputs("r").map(|(handle, held)| (handle, held.changes(), held.positions().collect::<Vec<_>>()));
    assert_eq!(state(&cache), None);
    cache.allocate("r", 0, "a", 4).unwrap();
    let (first, changes, positions) = state(&cache).unwrap();
    assert_eq!((changes, positions), (1, vec![0]));
    assert_eq!(cache.check_and_update_cache("r", 0, "a"), Ok(true));
    assert_eq!(state(&cache), Some((first, 1, vec![0])), "a hit on a held input changes nothing");
    assert!(!cache.free_encoder_input("r", 5));
    assert_eq!(state(&cache), Some((first, 1, vec![0])), "nor does freeing an input not held");
    cache.allocate("r", 1, "b", 4).unwrap();
    cache.free_encoder_input("r", 1);
    assert_eq!(state(&cache), Some((first, 3, vec![0])), "the same inputs, reached by two changes");
    // The last input freed takes the request out; back, it has another handle.
    cache.free_encoder_input("r", 0);
    assert_eq!(state(&cache), None);
    assert_eq!(cache.check_and_update_cache("r", 0, "a"), Ok(true));
    let (again, changes, positions) = state(&cache).unwrap();
    assert_eq!((changes, positions), (1, vec![0]));
    assert_ne!(again, first, "a request added again is named apart from its former self");
}

#[test]
fn a_held_key_is_shared_when_stored_and_found_by_text_pointer_or_handle() {
    let mut cache = PolicyCache::<Vllm>::new(8);
    let (request, item): (Key, Key) = (Key::from("r"), Key::from("imgA"));
    cache.allocate(&request, 0, &item, 4).unwrap();
    let stored_request = cache.requests().next().unwrap().0.clone();
    assert!(Arc::ptr_eq(&stored_request, &request));
    {
        let (stored_item, _, mut referrers) = cache.entries().next().unwrap();
        assert!(Arc::ptr_eq(stored_item, &item) && Arc::ptr_eq(referrers.next().unwrap(), &request));
    }
    // Another key with the same text, and plain text, name the same request and item.
    assert_eq!(cache.check_and_update_cache(&Key::from("r"), 0, "imgA"), Ok(true));
    assert_eq!(cache.cached_num_embeds(&Key::from("imgA")), Some(4));
    // A handle names it without a look-up, and a stale one falls back to the name.
    let handle = cache.item_handle("imgA");
    assert_eq!(cache.cached_num_embeds(KeyArg::from("imgA").at(handle)), Some(4));
    cache.free("r");
    assert!(cache.can_allocate(8, 8, 0), "imgA is evicted");
    assert_eq!(cache.cached_num_embeds(KeyArg::from("imgA").at(handle)), None);
    cache.allocate("s", 0, "imgB", 4).unwrap();
    assert_eq!(cache.item_handle("imgB").map(|h| h.index), handle.map(|h| h.index), "the slot is reused");
    assert_eq!(cache.cached_num_embeds(KeyArg::from("imgA").at(handle)), None, "a stale handle does not name imgB");
    assert_eq!(cache.num_requests(), 1);
}

#[test]
fn eviction_takes_the_oldest_release_first_and_stops_when_there_is_room() {
    let mut cache = EncoderCache::new(12);
    for (request, item) in [("r0", "a"), ("r1", "b"), ("r2", "c")] {
        cache.allocate(request, 0, item, 4).unwrap();
    }
    for request in ["r1", "r0", "r2"] {
        cache.free(request);
    }
    assert!(cache.can_allocate(6, 100, 0));
    assert_eq!(cache.freed().into_iter().map(|k| &**k).collect::<Vec<_>>(), ["b", "a"]);
    assert_eq!(freeable(&cache), vec![("c", 4)]);
    assert_eq!((cache.num_free_slots(), cache.num_freeable_slots()), (8, 12));
}

#[test]
fn an_item_evicted_and_allocated_again_is_not_reported_freed() {
    let mut cache = EncoderCache::new(8);
    cache.allocate("r1", 0, "a", 4).unwrap();
    cache.allocate("r2", 0, "b", 4).unwrap();
    cache.free("r1");
    cache.free("r2");
    assert!(cache.can_allocate(4, 100, 4));
    cache.allocate("r3", 0, "a", 4).unwrap();
    assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["b"]);
    assert!(cache.take_freed().is_empty());
}

#[test]
fn entries_taken_back_and_released_again_keep_the_order() {
    let mut cache = EncoderCache::new(3);
    for (input, item) in ["a", "b", "c"].into_iter().enumerate() {
        cache.allocate("r", input, item, 1).unwrap();
    }
    cache.free("r");
    for _ in 0..1000 {
        assert_eq!(cache.check_and_update_cache("s", 0, "a"), Ok(true));
        cache.free("s");
    }
    assert_eq!(freeable(&cache), vec![("b", 1), ("c", 1), ("a", 1)]);
    assert!(cache.can_allocate(2, 10, 0));
    assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["b", "c"]);
    assert_eq!(freeable(&cache), vec![("a", 1)]);
    assert_eq!(cache.check_invariants(), Ok(()));
}

#[test]
fn refused_allocations_change_nothing() {
    let mut cache = EncoderCache::new(8);
    cache.allocate("r1", 0, "a", 4).unwrap();
    let before = format!("{cache:?}");
    assert_eq!(cache.allocate("r2", 0, "a", 5), Err(CacheError::EmbedCountMismatch { identifier: "a".into(), cached: 4, requested: 5 }));
    assert_eq!(cache.allocate("r2", 0, "a", 4), Err(CacheError::AlreadyCached { identifier: "a".into() }));
    assert!(matches!(cache.allocate("r2", 0, "b", 5), Err(CacheError::InsufficientSpace { needed: 5, free: 4, .. })));
    assert_eq!(format!("{cache:?}"), before);
}

#[test]
fn free_releases_items_in_the_order_of_their_last_occurrence() {
    let mut cache = EncoderCache::new(30);
    cache.allocate("r1", 2, "b", 5).unwrap();
    cache.allocate("r1", 0, "c", 3).unwrap();
    cache.allocate("r1", 1, "a", 4).unwrap();
    assert_eq!(cache.check_and_update_cache("r1", 3, "a"), Ok(true));
    cache.free("r1");
    assert_eq!(freeable(&cache), vec![("c", 3), ("b", 5), ("a", 4)]);
    assert_eq!(cache.num_freeable_slots(), 30);
}

#[test]
fn budgets_outside_i64_arithmetic_do_not_overflow() {
    let mut cache = EncoderCache::new(u64::MAX);
    assert!(!cache.can_allocate(u64::MAX, i64::MAX, i64::MAX));
    assert!(!cache.can_allocate(1, i64::MIN, 0));
    assert!(cache.can_allocate(1, 1, i64::MIN));
}

#[test]
fn resize_grows_shrinks_by_evicting_and_refuses_below_the_entries_in_use() {
    let mut cache = EncoderCache::new(12);
    cache.allocate("r1", 0, "a", 4).unwrap();
    cache.allocate("r2", 0, "b", 4).unwrap();
    cache.free("r1");
    let before = format!("{cache:?}");
    assert_eq!(cache.resize(3), Err(CacheError::ReferencedExceedSize { cache_size: 3, referenced: 4 }));
    assert_eq!(format!("{cache:?}"), before, "a refused resize changes nothing");
    cache.resize(6).unwrap();
    assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), ["a"]);
    assert_eq!((cache.cache_size(), cache.num_free_slots(), cache.num_freeable_slots()), (6, 2, 2));
    cache.resize(20).unwrap();
    assert_eq!((cache.num_free_slots(), cache.num_freeable_slots()), (16, 16));
    assert_eq!(cache.check_invariants(), Ok(()));
}

#[test]
fn reset_returns_to_a_new_cache() {
    let mut cache = EncoderCache::new(10);
    cache.allocate("r1", 0, "a", 4).unwrap();
    cache.free("r1");
    assert!(cache.can_allocate(10, 10, 0));
    cache.reset();
    assert_eq!(cache.stats().total.evictions, 1, "reset keeps the counters");
    cache.reset_stats();
    assert_eq!(format!("{cache:?}"), format!("{:?}", EncoderCache::new(10)));
}

fn names(keys: &[Key]) -> Vec<&str> {
    keys.iter().map(|k| &**k).collect()
}

#[test]
fn the_event_log_records_storage_the_freed_report_and_resets_in_order() {
    let mut cache = EncoderCache::new(32);
    assert_eq!(cache.take_events(), None, "off by default");
    cache.enable_events(DEFAULT_MAX_PENDING);
    cache.allocate_tagged("a", 0, "x", 16, 1).unwrap();
    cache.free("a");
    assert!(cache.can_allocate(32, 100, 0)); // evicts x
    cache.allocate_tagged("b", 0, "y", 32, 2).unwrap();
    cache.free("b");
    assert!(cache.can_allocate(16, 100, 0)); // evicts y
    cache.allocate_tagged("c", 0, "x", 16, 1).unwrap(); // x again
    assert_eq!(names(&cache.take_freed()), vec!["y"], "x is cached again: not reported");
    let step = cache.take_events().unwrap();
    assert!(!step.cleared);
    assert_eq!(names(&step.removed), vec!["y"]);
    // y was evicted after its allocation, x is stored once, at its first place.
    assert_eq!(step.stored, vec![(Key::from("x"), 16, 1)]);
    assert!(cache.take_events().unwrap().is_empty());
    cache.allocate_tagged("d", 0, "z", 8, 3).unwrap();
    cache.reset();
    cache.allocate_tagged("e", 0, "w", 4, 0).unwrap();
    let step = cache.take_events().unwrap();
    assert!(step.cleared && step.removed.is_empty());
    assert_eq!(step.stored, vec![(Key::from("w"), 4, 0)], "what was pending before the reset is gone");
}

#[test]
fn an_undrained_log_overflows_into_a_clear_and_the_cached_entries() {
    let mut cache = EncoderCache::with_policy(100, Policy::Gdsf);
    cache.enable_events(3);
    for n in 0..5 {
        cache.allocate_tagged(format!("r{n}").as_str(), 0, format!("i{n}").as_str(), 10, 1).unwrap();
    }
    cache.free("r0");
    cache.resize(40).unwrap(); // evicts i0
    cache.take_freed();
    let step = cache.take_events().unwrap();
    assert!(step.cleared && step.removed.is_empty());
    assert_eq!(step.stored, cache.cached_items());
    assert_eq!(names(&step.stored.iter().map(|(k, _, _)| k.clone()).collect::<Vec<_>>()), vec!["i1", "i2", "i3", "i4"]);
    assert!(cache.take_events().unwrap().is_empty(), "the next drain is incremental again");
}

#[test]
fn a_stale_handle_finds_its_item_again_by_name() {
    // The item was evicted and cached again in another slot, its old one
    // reused: the handle is stale, the name still finds it.
    let mut cache = EncoderCache::new(8);
    cache.allocate("r", 0, "a", 4).unwrap();
    let stale = cache.item_handle("a");
    cache.free("r");
    assert!(cache.can_allocate(8, 8, 0), "a is evicted");
    cache.allocate("s", 0, "b", 4).unwrap();
    cache.allocate("s", 1, "a", 3).unwrap();
    assert_eq!(cache.item_handle("b").map(|h| h.index), stale.map(|h| h.index), "b took a's slot");
    assert_eq!(cache.cached_num_embeds(KeyArg::from("a").at(stale)), Some(3));
    assert_eq!(cache.cached_num_embeds(KeyArg::from("b").at(stale)), Some(4), "a stale handle never decides the answer");
}
