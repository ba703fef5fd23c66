//! Tests of the eviction policies, resizing, lookahead marks and counters.
// GDSF priorities are compared exactly: the twin must reach the same floats bit for bit.
#![allow(clippy::float_cmp, clippy::cast_precision_loss)]

use super::*;

fn keys(list: &[Key]) -> Vec<&str> {
    list.iter().map(|k| &**k).collect()
}

/// Allocates `item` of `n` embeddings for a one-item request `request`.
fn admit(cache: &mut EncoderCache, request: &str, item: &str, n: u64) {
    assert!(cache.can_allocate(n, i64::MAX, 0), "{item} must fit");
    cache.allocate(request, 0, item, n).unwrap();
}

/// `item` gets `hits` more acquisitions by short-lived requests.
fn hit(cache: &mut EncoderCache, item: &str, hits: usize) {
    for k in 0..hits {
        let request = format!("hit-{item}-{k}");
        assert_eq!(cache.check_and_update_cache(request.as_str(), 0, item), Ok(true));
        cache.free(request.as_str());
    }
}

/// Evicts by asking for `n` more embeddings than are free; the victims, in order.
fn evict_for(cache: &mut EncoderCache, n: u64) -> Vec<String> {
    assert!(cache.can_allocate(n, i64::MAX, 0));
    cache.take_freed().iter().map(ToString::to_string).collect()
}

#[test]
fn names_round_trip_and_vllm_is_the_default() {
    assert_eq!(Policy::NAMES, ["vllm", "gdsf", "s3fifo", "lfu-ghost", "arc", "duel"]);
    assert_eq!(Policy::from_name(Policy::AUTO), Some(Policy::RECOMMENDED));
    for (policy, name) in Policy::ALL.into_iter().zip(Policy::NAMES) {
        assert_eq!((policy.name(), Policy::from_name(name)), (*name, Some(policy)));
    }
    assert_eq!(Policy::from_name("lru"), None);
    assert_eq!(Policy::default(), Policy::Vllm);
    assert_eq!(EncoderCache::new(8).policy(), Policy::Vllm);
    assert_eq!(EncoderCache::with_policy(8, Policy::Gdsf).policy(), Policy::Gdsf);
}

#[test]
fn gdsf_evicts_the_lowest_priority_with_ties_in_release_order() {
    let mut cache = EncoderCache::with_policy(100, Policy::Gdsf);
    for (request, item) in [("r1", "often"), ("r2", "once"), ("r3", "big"), ("r4", "twin")] {
        admit(&mut cache, request, item, if item == "big" { 40 } else { 10 });
    }
    for request in ["r1", "r2", "r3", "r4"] {
        cache.free(request);
    }
    hit(&mut cache, "often", 2); // frequency 3, released last
                                 // once and twin tie (frequency 1, 10 embeds): the earlier release goes first;
                                 // big has the same frequency but a higher cost per embedding.
    assert_eq!(evict_for(&mut cache, 50), ["once", "twin"]);
    let value = |n: u64| 1.0 + n as f64 / GDSF_COST_SCALE;
    assert_eq!(cache.clock(), value(10), "the clock rose to the last victim's priority");
    assert_eq!(evict_for(&mut cache, 90), ["big"]);
    assert_eq!(cache.clock(), value(40));
    assert_eq!(cache.check_invariants(), Ok(()));
}

#[test]
fn gdsf_ages_frequent_entries_out_as_the_clock_rises() {
    let mut cache = EncoderCache::with_policy(30, Policy::Gdsf);
    admit(&mut cache, "r", "popular", 10);
    cache.free("r");
    hit(&mut cache, "popular", 2); // priority 3 * (1 + 10/C)
    let mut rounds = 0;
    loop {
        rounds += 1;
        let item = format!("new{rounds}");
        admit(&mut cache, "s", &item, 12); // priority clock + (1 + 12/C)
        cache.free("s");
        let victims = evict_for(&mut cache, 10);
        assert_eq!(victims.len(), 1);
        if victims.contains(&"popular".to_owned()) {
            break;
        }
        assert!(rounds < 10, "a popular entry nobody uses any more must age out");
    }
    // Each single-use victim raises the clock by about one: the third new item
    // outranks an entry acquired three times.
    assert_eq!(rounds, 3);
}

#[test]
fn s3fifo_evicts_a_scan_before_entries_that_were_hit() {
    let mut cache = EncoderCache::with_policy(60, Policy::S3Fifo);
    admit(&mut cache, "r", "hot", 10);
    cache.free("r");
    hit(&mut cache, "hot", 1);
    for k in 0..5 {
        let request = format!("scan{k}");
        admit(&mut cache, &request, &format!("frame{k}"), 10);
        cache.free(request.as_str());
    }
    // vllm would evict "hot" first: it was released longest ago.
    assert_eq!(evict_for(&mut cache, 30), ["frame0", "frame1", "frame2"]);
    assert_eq!(cache.freeable().into_iter().map(|(k, _)| &**k).collect::<Vec<_>>(), ["frame3", "frame4", "hot"]);
    assert_eq!(cache.check_invariants(), Ok(()));

    let mut vllm = EncoderCache::new(60);
    admit(&mut vllm, "r", "hot", 10);
    vllm.free("r");
    hit(&mut vllm, "hot", 1);
    for k in 0..5 {
        admit(&mut vllm, "scan", &format!("frame{k}"), 10);
        vllm.free("scan");
    }
    assert_eq!(evict_for(&mut vllm, 30), ["hot", "frame0", "frame1"]);
}

#[test]
fn s3fifo_main_entries_spend_hit_credit_before_eviction() {
    let mut cache = EncoderCache::with_policy(30, Policy::S3Fifo);
    for (item, hits) in [("a", 1), ("b", 3), ("c", 2)] {
        admit(&mut cache, "r", item, 10);
        cache.free("r");
        hit(&mut cache, item, hits);
    }
    // All in main, released a, b, c with credit 1, 3, 2: one pass costs a
    // credit each, so a (credit 1) goes at the second pass, c at the third.
    assert_eq!(evict_for(&mut cache, 10), ["a"]);
    assert_eq!(evict_for(&mut cache, 20), ["c"]);
    assert_eq!(cache.check_invariants(), Ok(()));
}

#[test]
fn resize_grows_shrinks_under_the_policy_and_refuses_what_does_not_fit() {
    for policy in Policy::ALL {
        let mut cache = EncoderCache::with_policy(30, policy);
        admit(&mut cache, "held", "h", 10);
        admit(&mut cache, "r1", "a", 5);
        admit(&mut cache, "r2", "b", 5);
        cache.free("r1");
        cache.free("r2");
        assert_eq!(cache.resize(50), Ok(()));
        assert_eq!((cache.cache_size(), cache.num_free_slots(), cache.num_freeable_slots()), (50, 30, 40));
        let before = format!("{cache:?}");
        assert_eq!(cache.resize(9), Err(CacheError::ReferencedExceedSize { cache_size: 9, referenced: 10 }));
        assert_eq!(format!("{cache:?}"), before, "a refused resize changes nothing");
        assert_eq!(cache.resize(15), Ok(()));
        assert_eq!(keys(&cache.take_freed()), ["a"], "{policy}: shrinking evicts under the policy");
        assert_eq!((cache.cache_size(), cache.num_free_slots(), cache.num_freeable_slots()), (15, 0, 5));
        assert_eq!(cache.stats().total.evictions, 1);
        assert_eq!(cache.check_invariants(), Ok(()));
        assert_eq!(cache.resize(10), Ok(()));
        assert_eq!((cache.num_free_slots(), cache.num_freeable_slots()), (0, 0));
        let restored = EncoderCache::restore_with(&cache.snapshot(), &cache.policy_snapshot()).unwrap();
        assert_eq!(restored.snapshot(), cache.snapshot());
    }
}

#[test]
fn entries_a_waiting_request_needs_go_after_every_other() {
    for policy in Policy::ALL {
        let mut cache = EncoderCache::with_policy(40, policy);
        // "later" is marked before it is even cached: the mark counts once it is.
        cache.mark_waiting("w1", ["needed", "later", "needed"].map(Key::from)).unwrap();
        for (k, item) in ["needed", "x", "later", "y"].into_iter().enumerate() {
            admit(&mut cache, &format!("r{k}"), item, 10);
        }
        hit(&mut cache, "x", 3);
        hit(&mut cache, "y", 3);
        for k in 0..4 {
            cache.free(format!("r{k}").as_str());
        }
        let order: Vec<&str> = cache.freeable().into_iter().map(|(k, _)| &**k).collect();
        assert_eq!(&order[2..], ["needed", "later"], "{policy}: tier 1 last, in release order");
        assert_eq!(cache.check_invariants(), Ok(()));
        let victims = evict_for(&mut cache, 30);
        assert_eq!(victims[..2], ["x", "y"], "{policy}: unneeded entries go first");
        assert_eq!(victims[2], "needed", "{policy}: then the needed ones");
        // Unmarking puts "later" back among the others, as released now.
        admit(&mut cache, "s", "z", 10);
        cache.free("s");
        cache.unmark_waiting("w1").unwrap();
        assert_eq!(cache.freeable().into_iter().map(|(k, _)| &**k).collect::<Vec<_>>(), ["z", "later"]);
        assert_eq!(cache.check_invariants(), Ok(()));
    }
}

#[test]
fn marks_are_counted_per_request_and_bad_marks_change_nothing() {
    let mut cache = EncoderCache::with_policy(20, Policy::Gdsf);
    admit(&mut cache, "r", "a", 10);
    cache.free("r");
    cache.mark_waiting("w1", [Key::from("a")]).unwrap();
    cache.mark_waiting("w2", [Key::from("a")]).unwrap();
    let before = format!("{cache:?}");
    assert_eq!(cache.mark_waiting("w1", [Key::from("b")]), Err(CacheError::AlreadyWaiting { request_id: "w1".into() }));
    assert_eq!(cache.unmark_waiting("nobody"), Err(CacheError::NotWaiting { request_id: "nobody".into() }));
    assert_eq!(format!("{cache:?}"), before);
    cache.unmark_waiting("w1").unwrap();
    assert_eq!(cache.policy_snapshot().waiting.len(), 1);
    assert_eq!(cache.check_invariants(), Ok(()));
    let state = (cache.snapshot(), cache.policy_snapshot());
    assert!(state.0.freeable.iter().any(|(k, _)| k == "a"));
    cache.reset();
    assert!(cache.waiting().is_empty() && cache.policy_snapshot().waiting.is_empty(), "reset drops the marks");
    let restored = EncoderCache::restore_with(&state.0, &state.1).unwrap();
    assert_eq!(restored.waiting().len(), 1);
    assert_eq!(restored.check_invariants(), Ok(()));
}

#[test]
fn hits_and_misses_are_counted_once_per_acquisition() {
    let mut cache = EncoderCache::new(20);
    cache.allocate_tagged("r1", 0, "img", 8, 1).unwrap();
    assert_eq!(cache.check_and_update_cache("r1", 0, "img"), Ok(true), "a re-check of a held input");
    assert_eq!(cache.stats().total, Counters { misses: 1, miss_embeds: 8, ..Counters::default() });
    assert_eq!(cache.check_and_update_cache("r1", 1, "img"), Ok(true), "the same item at another input");
    assert_eq!(cache.check_and_update_cache("r2", 0, "img"), Ok(true));
    assert_eq!(cache.check_and_update_cache("r2", 1, "other"), Ok(false), "a lookup that misses counts nothing");
    assert_eq!((cache.stats().total.hits, cache.stats().total.hit_embeds), (2, 16));
    cache.free("r1");
    cache.free("r2");
    cache.allocate_tagged("r3", 0, "clip", 12, 2).unwrap();
    assert!(cache.can_allocate(8, 100, 0));
    assert_eq!(keys(&cache.take_freed()), ["img"]);
    cache.allocate_tagged("r4", 0, "img", 8, 1).unwrap();
    let stats = cache.stats();
    assert_eq!(
        stats.total,
        Counters { hits: 2, misses: 3, hit_embeds: 16, miss_embeds: 28, evictions: 1, evicted_embeds: 8, reencodes: 1, reencode_embeds: 8 }
    );
    assert!(stats.by_modality[0].is_zero());
    assert_eq!(stats.by_modality[1], Counters { reencodes: 1, reencode_embeds: 8, misses: 2, miss_embeds: 16, ..stats.total });
    assert_eq!(stats.by_modality[2], Counters { misses: 1, miss_embeds: 12, ..Counters::default() });
    assert_eq!((cache.used_embeds(), cache.freeable_embeds()), (20, 0));
    cache.reset_stats();
    assert_eq!(cache.stats(), CacheStats::default());
    assert_eq!(cache.num_entries(), 2, "resetting the counters keeps the contents");
}

#[test]
fn the_memory_of_evicted_items_is_bounded() {
    let (mut ghosts, mut tally) = (stats::Ghosts::<()>::default(), stats::Tally::default());
    let hash = |k: usize| hash_key(&format!("i{k}"));
    for k in 0..EVICTED_MEMORY + 10 {
        ghosts.evicted(hash(k), 1, &mut tally);
    }
    assert!(!ghosts.remembers(hash(9), &mut tally), "the oldest are forgotten");
    assert!(ghosts.remembers(hash(10), &mut tally));
    ghosts.allocated(hash(10), 1, 8, &mut tally);
    assert!(!ghosts.remembers(hash(10), &mut tally), "an item leaves when it comes back");
    ghosts.allocated(hash(9), 1, 4, &mut tally);
    ghosts.apply(&mut tally);
    let counted = tally.report().total;
    assert_eq!((counted.reencodes, counted.reencode_embeds), (1, 8), "only the remembered one is a re-encode");
}

#[test]
fn collected_ghost_updates_apply_in_order_whenever_counters_are_read() {
    // An item evicted, allocated, evicted and allocated again within one
    // batch is two re-encodes; one evicted and allocated before its eviction
    // is none. Every read of the counters sees what was collected so far.
    let (mut ghosts, mut tally) = (stats::Ghosts::<()>::default(), stats::Tally::default());
    let (a, b) = (hash_key("a"), hash_key("b"));
    ghosts.allocated(b, 0, 3, &mut tally);
    ghosts.evicted(b, 1, &mut tally);
    for _ in 0..2 {
        ghosts.evicted(a, 1, &mut tally);
        ghosts.allocated(a, 2, 5, &mut tally);
    }
    ghosts.apply(&mut tally);
    let counted = tally.report().total;
    assert_eq!((counted.reencodes, counted.reencode_embeds), (2, 10));
    assert!(ghosts.remembers(b, &mut tally) && !ghosts.remembers(a, &mut tally));
}

/// The same operations on a cache and on its restored copy decide the same.
#[test]
fn a_restored_cache_evicts_as_the_original_would() {
    for policy in Policy::ALL {
        let mut cache = EncoderCache::with_policy(64, policy);
        for k in 0..12u64 {
            let (request, item) = (format!("r{k}"), format!("i{}", k % 7));
            if cache.check_and_update_cache(request.as_str(), 0, item.as_str()) != Ok(true) && cache.can_allocate(4 + k % 5, 100, 0) {
                cache.allocate(request.as_str(), 0, item.as_str(), 4 + k % 5).unwrap();
            }
            if k % 3 != 0 {
                cache.free(request.as_str());
            }
        }
        cache.mark_waiting("w", ["i2", "i5"].map(Key::from)).unwrap();
        cache.resize(40).unwrap();
        let mut restored = EncoderCache::restore_with(&cache.snapshot(), &cache.policy_snapshot()).unwrap();
        assert_eq!(restored.check_invariants(), Ok(()));
        for cache in [&mut cache, &mut restored] {
            assert!(cache.can_allocate(cache.num_freeable_slots(), 100, 0));
        }
        assert_eq!(cache.take_freed(), restored.take_freed(), "{policy}");
        assert_eq!(cache.snapshot(), restored.snapshot(), "{policy}");
        assert_eq!(cache.policy_snapshot(), restored.policy_snapshot(), "{policy}");
    }
}

#[test]
fn arc_takes_the_victim_by_its_target_and_ghost_hits_move_the_target() {
    // 40 embeddings, target 20. "hot" is frequent; three one-off items are recent.
    let mut cache = EncoderCache::with_policy(40, Policy::Arc);
    admit(&mut cache, "r", "hot", 10);
    cache.free("r");
    hit(&mut cache, "hot", 1);
    for item in ["a", "b", "c"] {
        admit(&mut cache, "r", item, 10);
        cache.free("r");
    }
    assert_eq!(cache.clock(), 20.0, "the target starts at half the cache size");
    // Recent entries hold 30 > 20: the oldest recent goes, although "hot" was released first.
    assert_eq!(evict_for(&mut cache, 10), ["a"]);
    // Now 20, not above the target: the oldest frequent entry goes.
    assert_eq!(evict_for(&mut cache, 30), ["hot", "b"]);
    assert_eq!(cache.check_invariants(), Ok(()));
    // "a" comes back from the recent ghosts: the target rises by its size
    // (times the frequent ghosts' 10 over the recent ghosts' 10, i.e. 1), and it is frequent.
    admit(&mut cache, "q", "a", 10);
    assert_eq!(cache.clock(), 30.0);
    cache.free("q");
    assert_eq!(cache.policy_snapshot().entries["a"].frequency, 2);
    // "hot" comes back from the frequent ghosts, now empty beside 10 recent
    // ghost embeddings ("b"): the target falls by 10 times 10, to its floor.
    admit(&mut cache, "q", "hot", 10);
    assert_eq!(cache.clock(), 0.0);
    assert_eq!(cache.check_invariants(), Ok(()));
}

#[test]
fn arc_target_scales_with_a_resize_and_survives_a_restore() {
    let mut cache = EncoderCache::with_policy(40, Policy::Arc);
    assert_eq!(cache.resize(100), Ok(()));
    assert_eq!(cache.clock(), 50.0);
    assert_eq!(cache.resize(10), Ok(()));
    assert_eq!(cache.clock(), 5.0);
    let restored = EncoderCache::restore_with(&cache.snapshot(), &cache.policy_snapshot()).unwrap();
    assert_eq!(restored.clock(), 5.0);
    let mut bad = cache.policy_snapshot();
    bad.clock = 11.0;
    assert!(EncoderCache::restore_with(&cache.snapshot(), &bad).is_err(), "a target above the cache size is refused");
    cache.reset();
    assert_eq!(cache.clock(), 5.0, "a reset starts again from half the size");
}

#[test]
fn heap_policies_evict_by_frequency_then_release_however_releases_interleave() {
    // Each item's hits taken together release items out of key order, so the lanes'
    // ordered run and heap both hold entries, and take-backs come from both.
    let hits = [5_usize, 3, 5, 0, 1, 0, 2, 2, 7, 1, 1, 4];
    for policy in [Policy::Gdsf, Policy::GhostLfu] {
        let mut cache = EncoderCache::with_policy(hits.len() as u64, policy);
        let mut released = vec![0_usize; hits.len()];
        let mut clock = 0;
        for i in 0..hits.len() {
            admit(&mut cache, &format!("r{i}"), &format!("i{i}"), 1);
        }
        for (i, at) in released.iter_mut().enumerate() {
            cache.free(format!("r{i}").as_str());
            clock += 1;
            *at = clock;
        }
        for (i, &n) in hits.iter().enumerate() {
            for _ in 0..n {
                hit(&mut cache, &format!("i{i}"), 1);
                clock += 1;
                released[i] = clock;
            }
        }
        let mut expected: Vec<usize> = (0..hits.len()).collect();
        expected.sort_by_key(|&i| (hits[i], released[i]));
        let expected: Vec<String> = expected.iter().map(|i| format!("i{i}")).collect();
        let listed: Vec<String> = cache.freeable().iter().map(|(key, _)| key.to_string()).collect();
        assert_eq!(listed, expected, "{policy}: the order as listed");
        assert_eq!(evict_for(&mut cache, hits.len() as u64), expected, "{policy}: the order evicted");
    }
}
