//! Coverage-guided fuzzing of the core: the input bytes are decoded into a
//! cache size and a sequence of operations, each followed by the invariant
//! checks of tests/common/ops.rs; any failure aborts with its message. The
//! first byte picks the cache size and the eviction policy.

#![no_main]

use encoder_cache::EncoderCache;
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/ops.rs"]
mod ops;

use ops::{apply, Op, INPUTS, ITEMS, POLICIES, REQUESTS};

/// Three bytes per operation: kind, then two operands.
fn decode(chunk: &[u8]) -> Op {
    let (kind, a, b) = (chunk[0], chunk[1], chunk[2]);
    let request = a % REQUESTS;
    let input = usize::from(a / REQUESTS) % INPUTS;
    let item = b % ITEMS;
    match kind % 16 {
        0..=2 => Op::CheckAndUpdate { request, input, item },
        3..=5 => Op::CanAllocate { item, budget: i64::from(a) - 8, scheduled: i64::from(b / ITEMS) - 8 },
        6..=8 => Op::Allocate { request, input, item, size: (kind >= 128).then_some(u64::from(b / ITEMS)) },
        9 | 10 => Op::FreeInput { request, input },
        11 => Op::Free { request },
        12 => Op::TakeFreed,
        13 => Op::Step { request, computed: i64::from(a / 2), new_tokens: i64::from(b / 3), budget: i64::from(kind / 4) - 4 },
        14 => Op::FreeBefore { request, position: i64::from(b / 2) },
        _ => match kind / 16 % 8 {
            0 => Op::Restore,
            1 => Op::Reset,
            2 => Op::Resize { size: u64::from(b % 64) },
            3 | 4 => Op::Unmark { request },
            _ => Op::Mark { request, items: b },
        },
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, rest)) = data.split_first() else { return };
    let policy = POLICIES[usize::from(size / 64) % POLICIES.len()];
    let mut cache = EncoderCache::with_policy(u64::from(size % 64), policy);
    for chunk in rest.chunks_exact(3) {
        if let Err(failure) = apply(&mut cache, &decode(chunk)) {
            panic!("{failure}");
        }
    }
});
