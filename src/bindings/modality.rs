//! Modality names (`mm_features[i].modality`: "image", "video", "audio", ...)
//! as the small tags the core counts statistics under.
//!
//! One table for the process, so every manager gives a name the same tag and
//! dumps carry names. Tag 0 is "unknown": an item without a str `modality`,
//! and any name past the 255th.

use std::sync::{Mutex, PoisonError};

/// The name of tag 0.
pub(crate) const UNKNOWN: &str = "unknown";

/// Names by tag - 1.
static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The tag of `name`, given one on its first use.
pub(crate) fn tag(name: &str) -> u8 {
    if name == UNKNOWN {
        return 0;
    }
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    let index = names.iter().position(|known| known == name).unwrap_or_else(|| {
        names.push(name.to_owned());
        names.len() - 1
    });
    u8::try_from(index + 1).unwrap_or(0)
}

/// The name of `tag`.
pub(crate) fn name(tag: u8) -> String {
    let names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    usize::from(tag).checked_sub(1).and_then(|index| names.get(index)).map_or_else(|| UNKNOWN.to_owned(), Clone::clone)
}
