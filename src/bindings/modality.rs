//! Modality names (`mm_features[i].modality`: "image", "video", "audio", ...)
//! as the small tags the core counts statistics under.
//!
//! One table for the process, so every manager gives a name the same tag and
//! dumps carry names. Tag 0 is "unknown": an item without a str `modality`,
//! and any name past the 255th.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Mutex, PoisonError};

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

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

/// A tag not given yet, in [`COMMON_TAGS`].
const NOT_YET: u16 = u16::MAX;

/// The tags of "image", "video" and "audio", once given.
static COMMON_TAGS: [AtomicU16; 3] = [const { AtomicU16::new(NOT_YET) }; 3];

/// The tag of the name `name` holds. A name that is the interned "image",
/// "video" or "audio" (a literal in the caller's code) is known by
/// identity, without reading its text.
pub(crate) fn tag_of(name: &Bound<'_, PyString>) -> PyResult<u8> {
    let py = name.py();
    let common = [intern!(py, "image"), intern!(py, "video"), intern!(py, "audio")];
    if let Some(i) = common.iter().position(|common| name.is(common)) {
        return Ok(match COMMON_TAGS[i].load(Ordering::Relaxed) {
            NOT_YET => {
                let given = tag(common[i].to_str()?);
                COMMON_TAGS[i].store(u16::from(given), Ordering::Relaxed);
                given
            }
            given => u8::try_from(given).unwrap_or(0),
        });
    }
    Ok(tag(name.to_str()?))
}

/// The name of `tag`.
pub(crate) fn name(tag: u8) -> String {
    let names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    usize::from(tag).checked_sub(1).and_then(|index| names.get(index)).map_or_else(|| UNKNOWN.to_owned(), Clone::clone)
}
