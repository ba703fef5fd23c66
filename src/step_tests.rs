//! The step functions against both caches.

use super::*;
use crate::cache::EncoderCache;
use crate::encoder_decoder::EncoderDecoderCache;
use std::sync::Arc;

fn item(identifier: &str, offset: u64, length: u64) -> Item {
    Item::new(Arc::from(identifier), offset, length, length, None)
}

fn masked(identifier: &str, offset: u64, mask: &[bool]) -> Item {
    let n = mask.iter().filter(|&&b| b).count() as u64;
    Item::new(Arc::from(identifier), offset, mask.len() as u64, n, Some(mask))
}

fn args(num_computed_tokens: i64, num_new_tokens: i64, encoder_compute_budget: i64) -> StepArgs {
    StepArgs { num_computed_tokens, num_new_tokens, encoder_compute_budget, ..StepArgs::default() }
}

fn step<C: StepCache>(cache: &mut C, items: &[Item], a: StepArgs) -> Scheduled {
    try_schedule::<C, _, StepError>(cache, "r", items, a, &mut |_| Ok(false)).unwrap()
}

/// Items of which only `read` have full records.
struct Partly<'a> {
    items: &'a [Item],
    read: std::ops::Range<usize>,
}

impl Items for Partly<'_> {
    fn num_items(&self) -> usize {
        self.items.len()
    }

    fn position(&self, input_id: usize) -> Option<(u64, u64)> {
        self.items.position(input_id)
    }

    fn item(&self, input_id: usize) -> Result<&Item, StepError> {
        let item = self.items.item(input_id)?;
        self.read.contains(&input_id).then_some(item).ok_or(StepError::NotRead { input_id })
    }
}

#[test]
fn the_window_bisects_like_vllm() {
    let items = [item("a", 0, 4), item("b", 10, 4), item("c", 20, 4)];
    assert_eq!(window(&items[..], args(0, 12, 0), false), 0..2);
    assert_eq!(window(&items[..], args(4, 7, 0), false), 1..2);
    assert_eq!(window(&items[..], args(14, 6, 0), false), 2..2);
    assert_eq!(window(&items[..], StepArgs { shift_computed_tokens: 1, ..args(14, 6, 0) }, false), 2..3);
    assert_eq!(window(&items[..], args(14, 20, 0), true), 0..3);
    assert_eq!(window(&items[..], args(0, 0, 0), false), 0..0);
}

#[test]
fn the_window_search_asks_for_few_positions() {
    // 1,000 items of 4 tokens every 10; the step covers items 900 to 915.
    let mut asked = Vec::new();
    let position = |input_id: usize| {
        asked.push(input_id);
        Ok::<_, ()>((10 * input_id as u64, 4))
    };
    assert_eq!(window_by(1000, args(9000, 160, 0), false, position), Ok(900..916));
    assert!(asked.len() <= 2 * 10, "{} positions asked for", asked.len());
    // A failed read ends the search with that error.
    assert_eq!(window_by(1000, args(9000, 160, 0), false, |_| Err::<(u64, u64), _>("unreadable")), Err("unreadable"));
}

#[test]
fn only_the_items_a_call_needs_must_be_read() {
    let items = [item("a", 0, 4), item("b", 10, 4), item("c", 20, 4)];
    let mut cache = EncoderCache::new(100);
    let partly = Partly { items: &items, read: 1..2 };
    let out = try_schedule::<_, _, StepError>(&mut cache, "r", &partly, args(4, 8, 100), &mut |_| Ok(false));
    assert_eq!(out.unwrap().to_encode, vec![1]);
    let err = try_schedule::<_, _, StepError>(&mut cache, "r", &partly, args(4, 20, 100), &mut |_| Ok(false));
    assert_eq!(err, Err(StepError::NotRead { input_id: 2 }));
    assert_eq!(allocate_inputs(&mut cache, "r", &partly, &[1, 2], &[]), Err(StepError::NotRead { input_id: 2 }));
    assert!(cache.num_requests() == 0, "nothing allocated");
    allocate_inputs(&mut cache, "r", &partly, &[1], &[]).unwrap();
    assert_eq!(free_inputs_before(&mut cache, "r", &partly, 20, false).unwrap(), vec![1]);
    // Encoder-decoder frees by position too: the cache knows each held input's size.
    let mut cache = EncoderDecoderCache::new(100);
    allocate_inputs(&mut cache, "r", &items[..], &[0, 1, 2], &[]).unwrap();
    assert_eq!(free_inputs_before(&mut cache, "r", &partly, 0, true), Ok(vec![0, 1, 2]));
    assert_eq!(cache.num_free_slots(), 100);
}

#[test]
fn embeds_in_range_follows_the_mask() {
    let it = masked("a", 2, &[false, true, false, true, true]);
    assert_eq!(it.embeds_in_range(0, 5), Some((0, 3)));
    assert_eq!(it.embeds_in_range(1, 2), Some((0, 1)));
    assert_eq!(it.embeds_in_range(2, 3), Some((1, 1)));
    assert_eq!(it.embeds_in_range(0, 6), None);
    assert_eq!(item("b", 0, 4).embeds_in_range(1, 3), Some((1, 3)));
}

#[test]
fn schedules_the_items_in_the_window() {
    let items = [item("a", 0, 4), item("b", 10, 4), item("c", 20, 4)];
    let mut cache = EncoderCache::new(100);
    let out = step(&mut cache, &items, args(0, 12, 100));
    assert_eq!(out.to_encode, vec![0, 1]);
    assert_eq!((out.num_new_tokens, out.encoder_compute_budget), (12, 92));
    // An item already past the computed tokens is out of the window.
    let out = step(&mut cache, &items, args(4, 20, 100));
    assert_eq!(out.to_encode, vec![1, 2]);
}

#[test]
fn hits_repeats_and_budget_cut() {
    let items = [item("a", 0, 4), item("a", 5, 4), item("b", 10, 8)];
    let mut cache = EncoderCache::new(100);
    cache.allocate("other", 0, "b", 8).unwrap();
    let out = step(&mut cache, &items, args(0, 20, 4));
    assert_eq!((out.to_encode, out.repeated), (vec![0], vec![1]));
    assert_eq!((out.num_new_tokens, out.encoder_compute_budget), (20, 0));
    assert!(cache.holds_input("r", 2), "the hit on b was taken");
    // Without b cached, the budget stops the step before b.
    let mut cache = EncoderCache::new(100);
    let out = step(&mut cache, &items, args(0, 20, 4));
    assert_eq!((out.to_encode, out.num_new_tokens), (vec![0], 10));
}

#[test]
fn an_item_that_cannot_fit_stops_at_its_start() {
    let items = [item("a", 3, 50)];
    let mut cache = EncoderCache::new(10);
    assert_eq!(step(&mut cache, &items, args(0, 60, 100)).num_new_tokens, 3);
    // Already past its start (prefix caching): nothing can be scheduled.
    assert_eq!(step(&mut cache, &items, args(5, 60, 100)).num_new_tokens, 0);
}

#[test]
fn chunking_disabled_rolls_back_before_the_item_and_the_shift() {
    let items = [item("a", 10, 8)];
    let mut cache = EncoderCache::new(100);
    let a = StepArgs { disable_chunked_mm_input: true, shift_computed_tokens: 2, ..args(0, 12, 100) };
    let out = step(&mut cache, &items, a);
    assert_eq!((out.to_encode.len(), out.num_new_tokens), (0, 8));
}

#[test]
fn mismatch_rejects_after_earlier_hits() {
    let items = [item("a", 0, 4), Item::new(Arc::from("b"), 5, 4, 4, None)];
    let mut cache = EncoderCache::new(100);
    cache.allocate("other", 0, "a", 4).unwrap();
    cache.allocate("other", 1, "b", 3).unwrap();
    let out = step(&mut cache, &items, args(0, 10, 50));
    let m = out.mismatch.expect("rejected");
    assert_eq!((m.input_id, m.cached, m.requested), (1, 3, 4));
    assert_eq!((out.num_new_tokens, out.encoder_compute_budget), (0, 50));
    assert!(out.to_encode.is_empty() && out.repeated.is_empty());
    assert!(cache.holds_input("r", 0), "the hit before the mismatch stays");
}

#[test]
fn a_held_input_is_still_checked_against_its_item() {
    let mut cache = EncoderCache::new(100);
    let items = [item("a", 0, 4)];
    allocate_inputs(&mut cache, "r", &items[..], &[0], &[]).unwrap();
    let hit = step(&mut cache, &items, args(0, 4, 100));
    assert_eq!(hit, Scheduled { num_new_tokens: 4, encoder_compute_budget: 100, ..Scheduled::default() });
    // The same request id and input with another size: rejected, as vLLM would.
    let resized = [Item::new(Arc::from("a"), 0, 4, 5, None)];
    assert_eq!(step(&mut cache, &resized, args(0, 4, 100)).mismatch.map(|m| m.cached), Some(4));
    // Another identifier at the held input is refused (free the input first).
    let err = try_schedule::<_, _, StepError>(&mut cache, "r", &[item("b", 0, 4)][..], args(0, 4, 100), &mut |_| Ok(false));
    assert!(matches!(err, Err(StepError::Cache(CacheError::InputHeld { input_id: 0, .. }))));
}

#[test]
fn masked_tokens_without_embeds_are_skipped() {
    let items = [masked("a", 0, &[false, false, true, true])];
    let mut cache = EncoderCache::new(100);
    assert!(step(&mut cache, &items, args(0, 2, 100)).to_encode.is_empty());
    assert_eq!(step(&mut cache, &items, args(0, 3, 100)).to_encode, vec![0]);
}

#[test]
fn remote_items_take_space_not_budget() {
    let items = [item("a", 0, 4), item("b", 4, 4)];
    let mut cache = EncoderCache::new(6);
    let out = try_schedule::<_, _, StepError>(&mut cache, "r", &items[..], args(0, 8, 10), &mut |id| Ok(&**id == "a")).unwrap();
    assert_eq!((out.from_remote, out.to_encode), (vec![0], vec![]));
    assert_eq!((out.num_new_tokens, out.encoder_compute_budget), (4, 10));
}

#[test]
fn callback_errors_propagate() {
    let items = [item("a", 0, 4)];
    let mut cache = EncoderCache::new(6);
    let err =
        try_schedule(&mut cache, "r", &items[..], args(0, 8, 10), &mut |_| Err(StepError::InputOutOfRange { input_id: 9, num_items: 0 }));
    assert!(err.is_err());
}

#[test]
fn evicted_and_allocated_again_in_one_step_is_not_freed() {
    let mut cache = EncoderCache::new(8);
    cache.allocate("old", 0, "a", 4).unwrap();
    cache.allocate("old", 1, "b", 4).unwrap();
    cache.free("old");
    let items = [item("c", 0, 4), item("a", 4, 4)];
    let out = step(&mut cache, &items, args(0, 8, 100));
    assert_eq!(out.to_encode, vec![0, 1]);
    assert_eq!(cache.freed().len(), 2);
    allocate_inputs(&mut cache, "r", &items[..], &out.to_encode, &out.repeated).unwrap();
    assert_eq!(cache.take_freed().iter().map(|k| &**k).collect::<Vec<_>>(), vec!["b"]);
}

#[test]
fn allocate_checks_ids_first_and_frees_by_position() {
    let items = [item("a", 0, 4), item("a", 4, 4), item("b", 10, 4)];
    let mut cache = EncoderCache::new(100);
    let err = allocate_inputs(&mut cache, "r", &items[..], &[0], &[7]).unwrap_err();
    assert_eq!(err, StepError::InputOutOfRange { input_id: 7, num_items: 3 });
    assert_eq!(cache.num_free_slots(), 100);
    allocate_inputs(&mut cache, "r", &items[..], &[0, 2], &[1]).unwrap();
    assert_eq!(free_inputs_before(&mut cache, "r", &items[..], 8, false).unwrap(), vec![0, 1]);
    assert_eq!(cache.num_freeable_slots(), 96, "a is released with its last occurrence");
    assert_eq!(free_inputs_before(&mut cache, "r", &items[..], 20, false).unwrap(), vec![2]);
    assert!(cache.num_requests() == 0);
}

#[test]
fn encoder_decoder_rules() {
    let items = [item("a", 0, 6), item("b", 0, 6)];
    let mut cache = EncoderDecoderCache::new(10);
    let out = step(&mut cache, &items, args(0, 4, 100));
    assert_eq!((out.to_encode, out.num_new_tokens), (vec![0], 0), "b does not fit beside a");
    let out = step(&mut cache, &items, args(3, 4, 100));
    assert!(out.to_encode.is_empty());
    let err = allocate_inputs(&mut cache, "r", &items[..], &[0, 1], &[]).unwrap_err();
    assert!(matches!(err, StepError::Cache(CacheError::InsufficientSpace { .. })), "no room for both");
    assert_eq!(cache.num_free_slots(), 4, "a refused allocation stops the call there");
    cache.free("r");
    cache.resize(12).unwrap();
    allocate_inputs(&mut cache, "r", &items[..], &[0, 1], &[]).unwrap();
    assert_eq!(cache.num_free_slots(), 0);
    assert_eq!(free_inputs_before(&mut cache, "r", &items[..], 0, true).unwrap(), vec![0, 1]);
    assert_eq!(cache.num_free_slots(), 12);
    assert!(free_inputs_before(&mut cache, "r", &items[..], 0, true).unwrap().is_empty(), "each input is freed once");
    assert_eq!(cache.num_free_slots(), 12);
    let late = [item("a", 3, 6)];
    let err = try_schedule::<_, _, StepError>(&mut cache, "r", &late[..], args(1, 4, 100), &mut |_| Ok(false));
    assert_eq!(err, Err(StepError::EncoderDecoderOffset { input_id: 0, offset: 3 }));
}
