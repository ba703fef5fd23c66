//! The request, item and placeholder classes whose behaviour the bindings
//! know: vLLM's `Request`, `MultiModalFeatureSpec` and `PlaceholderRange`, and
//! ours (`encoder_cache.Request`, `MultiModalFeature`, `PlaceholderRange`).
//! For objects of exactly these classes (not subclasses, which may override a
//! method), `request.get_num_encoder_embeds(i)` is
//! `mm_features[i].mm_position.get_num_embeds()`, which is the placeholder's
//! `length` when it has no `is_embed` mask, so the bindings read the length
//! instead of calling two Python methods; and an item's attributes are plain
//! fields whose reads run no Python code, so all of them are read at once.
//!
//! A class is judged once by its `__module__` and `__qualname__`; the verdict
//! is kept with the class object (held, so its address is not reused), and
//! the addresses of the classes judged are also kept in plain atomic slots,
//! so that a class seen before is recognised by a few loads and compares,
//! without taking the lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::PyType;

/// `(module, qualified name)` of each known class.
const KNOWN: [(&str, &str); 6] = [
    ("encoder_cache.request", "Request"),
    ("encoder_cache.request", "MultiModalFeature"),
    ("encoder_cache.request", "PlaceholderRange"),
    ("vllm.v1.request", "Request"),
    ("vllm.multimodal.inputs", "MultiModalFeatureSpec"),
    ("vllm.multimodal.inputs", "PlaceholderRange"),
];

/// How many classes' verdicts are kept; others are judged on every call.
const MAX_VERDICTS: usize = 32;

static VERDICTS: Mutex<Vec<(Py<PyType>, bool)>> = Mutex::new(Vec::new());

/// How many judged classes of each verdict are found without the lock.
const FAST_SLOTS: usize = 8;

/// Addresses of classes judged known (`FAST[0]`) and not known (`FAST[1]`),
/// 0 in a free slot. A class is written here only once its verdict is in
/// [`VERDICTS`], which holds it, so an address here always names that class.
static FAST: [[AtomicUsize; FAST_SLOTS]; 2] = [const { [const { AtomicUsize::new(0) }; FAST_SLOTS] }; 2];

/// Whether `obj`'s class is exactly one of the known classes.
pub(crate) fn is_known(obj: &Bound<'_, PyAny>) -> bool {
    let address = obj.get_type_ptr() as usize;
    for (verdict, slots) in [true, false].into_iter().zip(&FAST) {
        for slot in slots {
            match slot.load(Ordering::Acquire) {
                0 => break,
                seen if seen == address => return verdict,
                _ => {}
            }
        }
    }
    let class = obj.get_type();
    {
        let verdicts = VERDICTS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, known)) = verdicts.iter().find(|(seen, _)| seen.is(&class)) {
            return *known;
        }
    }
    // Judged with the lock released: reading a class's names may run Python code.
    let known = judge(&class);
    let mut verdicts = VERDICTS.lock().unwrap_or_else(PoisonError::into_inner);
    if verdicts.len() < MAX_VERDICTS && !verdicts.iter().any(|(seen, _)| seen.is(&class)) {
        verdicts.push((class.unbind(), known));
        // Still under the lock, so no two writers race for a slot.
        let slots = &FAST[usize::from(!known)];
        if let Some(free) = slots.iter().find(|slot| slot.load(Ordering::Acquire) == 0) {
            free.store(address, Ordering::Release);
        }
    }
    known
}

fn judge(class: &Bound<'_, PyType>) -> bool {
    let (Ok(module), Ok(name)) = (class.module(), class.qualname()) else {
        return false;
    };
    let (Ok(module), Ok(name)) = (module.to_str(), name.to_str()) else {
        return false;
    };
    KNOWN.iter().any(|&(m, n)| m == module && n == name)
}
