//! Coverage-guided fuzzing of the core: the input bytes are decoded into a
//! cache size and a sequence of operations, each followed by the invariant
//! checks of tests/common/ops.rs; any failure aborts with its message.

#![no_main]

use encoder_cache::EncoderCache;
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/ops.rs"]
mod ops;

use ops::{apply, Op, INPUTS, ITEMS, REQUESTS};

/// Three bytes per operation: kind, then two operands.
fn decode(chunk: &[u8]) -> Op {
    let (kind, a, b) = (chunk[0], chunk[1], chunk[2]);
    let request = a % REQUESTS;
    let input = usize::from(a / REQUESTS) % INPUTS;
    let item = b % ITEMS;
    match kind % 16 {
        0..=3 => Op::CheckAndUpdate { request, input, item },
        4..=6 => Op::CanAllocate { item, budget: i64::from(a) - 8, scheduled: i64::from(b / ITEMS) - 8 },
        7..=10 => Op::Allocate { request, input, item, size: (kind >= 128).then_some(u64::from(b / ITEMS)) },
        11 | 12 => Op::FreeInput { request, input },
        13 => Op::Free { request },
        14 => Op::TakeFreed,
        _ if kind & 16 == 0 => Op::Restore,
        _ => Op::Reset,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&size, rest)) = data.split_first() else { return };
    let mut cache = EncoderCache::new(u64::from(size % 64));
    for chunk in rest.chunks_exact(3) {
        if let Err(failure) = apply(&mut cache, &decode(chunk)) {
            panic!("{failure}");
        }
    }
});
