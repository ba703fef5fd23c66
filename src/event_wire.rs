//! One drain of the cache's event log ([`StepEvents`]) as the payload of an
//! event message: msgpack of `[timestamp, events, engine]`, each event a map
//! tagged by `"type"` (the format `encoder_cache.events.wire` documents).
//!
//! The events, in order: `EncoderCacheCleared` if the cache was cleared, one
//! `EncoderCacheRemoved` with the freed names, then one `EncoderCacheStored`
//! per stored entry. Every value takes msgpack's shortest form, as Python's
//! `msgpack.packb(..., use_bin_type=True)` and msgspec write it, so a batch
//! encodes to the same bytes here as through either of them.

use crate::cache::StepEvents;

pub const STORED: &str = "EncoderCacheStored";
pub const REMOVED: &str = "EncoderCacheRemoved";
pub const CLEARED: &str = "EncoderCacheCleared";

/// How many event maps `events` makes.
pub fn event_count(events: &StepEvents) -> usize {
    usize::from(events.cleared) + usize::from(!events.removed.is_empty()) + events.stored.len()
}

/// The payload of `events` (see the module doc); `modality` names a stored
/// entry's modality tag, `medium` goes into every removed and stored event.
pub fn encode_payload(events: &StepEvents, timestamp: f64, engine: i64, medium: &str, modality: impl Fn(u8) -> String) -> Vec<u8> {
    let mut names: Vec<(u8, String)> = Vec::new();
    let mut out = Writer(Vec::with_capacity(64 + 96 * event_count(events)));
    out.array(3);
    out.float(timestamp);
    out.array(event_count(events));
    if events.cleared {
        out.map(1);
        out.entry("type", CLEARED);
    }
    if !events.removed.is_empty() {
        out.map(3);
        out.entry("type", REMOVED);
        out.str("hashes");
        out.array(events.removed.len());
        for key in &events.removed {
            out.str(key);
        }
        out.entry("medium", medium);
    }
    for (key, num_embeds, tag) in &events.stored {
        let known = names.iter().position(|(known, _)| known == tag);
        let name = if let Some(i) = known {
            &names[i].1
        } else {
            names.push((*tag, modality(*tag)));
            &names[names.len() - 1].1
        };
        out.map(5);
        out.entry("type", STORED);
        out.entry("hash", key);
        out.str("embeds");
        out.uint(*num_embeds);
        out.entry("modality", name);
        out.entry("medium", medium);
    }
    out.int(engine);
    out.0
}

/// msgpack's shortest form of each value written.
struct Writer(Vec<u8>);

impl Writer {
    /// A length header: `fixed` (tag, bound) below the bound, else the
    /// 8-bit form where the type has one, else the 16- or 32-bit form of `wide`.
    fn header(&mut self, len: usize, fixed: (u8, usize), len8: Option<u8>, wide: (u8, u8)) {
        let out = &mut self.0;
        if len < fixed.1 {
            // Below the bound (16 or 32), `len` fits the tag's low bits.
            out.push(fixed.0 | u8::try_from(len).unwrap_or(0));
        } else if let (Some(tag), Ok(n)) = (len8, u8::try_from(len)) {
            out.extend_from_slice(&[tag, n]);
        } else if let Ok(n) = u16::try_from(len) {
            out.push(wide.0);
            out.extend_from_slice(&n.to_be_bytes());
        } else {
            out.push(wide.1);
            out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        }
    }

    fn array(&mut self, len: usize) {
        self.header(len, (0x90, 16), None, (0xdc, 0xdd));
    }

    fn map(&mut self, len: usize) {
        self.header(len, (0x80, 16), None, (0xde, 0xdf));
    }

    fn str(&mut self, s: &str) {
        self.header(s.len(), (0xa0, 32), Some(0xd9), (0xda, 0xdb));
        self.0.extend_from_slice(s.as_bytes());
    }

    fn entry(&mut self, key: &str, value: &str) {
        self.str(key);
        self.str(value);
    }

    fn float(&mut self, value: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&value.to_be_bytes());
    }

    fn uint(&mut self, value: u64) {
        let out = &mut self.0;
        if let Ok(v) = u8::try_from(value) {
            if v < 0x80 {
                out.push(v);
            } else {
                out.extend_from_slice(&[0xcc, v]);
            }
        } else if let Ok(v) = u16::try_from(value) {
            out.push(0xcd);
            out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = u32::try_from(value) {
            out.push(0xce);
            out.extend_from_slice(&v.to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }

    fn int(&mut self, value: i64) {
        if let Ok(v) = u64::try_from(value) {
            return self.uint(v);
        }
        let out = &mut self.0;
        if value >= -32 {
            out.extend_from_slice(&value.to_be_bytes()[7..]); // negative fixint: the low byte
        } else if let Ok(v) = i8::try_from(value) {
            out.push(0xd0);
            out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = i16::try_from(value) {
            out.push(0xd1);
            out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = i32::try_from(value) {
            out.push(0xd2);
            out.extend_from_slice(&v.to_be_bytes());
        } else {
            out.push(0xd3);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Key;

    fn bytes_of(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        f(&mut w);
        w.0
    }

    #[test]
    fn integers_take_the_shortest_form() {
        assert_eq!(bytes_of(|w| w.uint(0)), [0x00]);
        assert_eq!(bytes_of(|w| w.uint(127)), [0x7f]);
        assert_eq!(bytes_of(|w| w.uint(128)), [0xcc, 0x80]);
        assert_eq!(bytes_of(|w| w.uint(256)), [0xcd, 0x01, 0x00]);
        assert_eq!(bytes_of(|w| w.uint(65_536)), [0xce, 0, 1, 0, 0]);
        assert_eq!(bytes_of(|w| w.uint(1 << 32)), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(bytes_of(|w| w.int(-1)), [0xff]);
        assert_eq!(bytes_of(|w| w.int(-32)), [0xe0]);
        assert_eq!(bytes_of(|w| w.int(-33)), [0xd0, 0xdf]);
        assert_eq!(bytes_of(|w| w.int(-129)), [0xd1, 0xff, 0x7f]);
        assert_eq!(bytes_of(|w| w.int(-32_769)), [0xd2, 0xff, 0xff, 0x7f, 0xff]);
        assert_eq!(bytes_of(|w| w.int(i64::MIN))[0], 0xd3);
    }

    #[test]
    fn strings_and_containers_take_the_shortest_header() {
        assert_eq!(bytes_of(|w| w.str("ab")), [0xa2, b'a', b'b']);
        let s31 = "x".repeat(31);
        assert_eq!(bytes_of(|w| w.str(&s31))[0], 0xbf);
        assert_eq!(bytes_of(|w| w.str(&"x".repeat(32)))[..2], [0xd9, 32]);
        assert_eq!(bytes_of(|w| w.str(&"x".repeat(256)))[..3], [0xda, 1, 0]);
        assert_eq!(bytes_of(|w| w.str(&"x".repeat(65_536)))[..5], [0xdb, 0, 1, 0, 0]);
        assert_eq!(bytes_of(|w| w.array(15)), [0x9f]);
        assert_eq!(bytes_of(|w| w.array(16)), [0xdc, 0, 16]);
        assert_eq!(bytes_of(|w| w.array(70_000))[0], 0xdd);
        assert_eq!(bytes_of(|w| w.map(3)), [0x83]);
        assert_eq!(bytes_of(|w| w.map(16)), [0xde, 0, 16]);
        assert_eq!(bytes_of(|w| w.float(1.5)), [0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_batch_lists_cleared_removed_then_stored() {
        let events = StepEvents {
            cleared: true,
            removed: vec![Key::from("old")],
            stored: vec![(Key::from("new"), 300, 1), (Key::from("clip"), 4, 2)],
        };
        assert_eq!(event_count(&events), 4);
        let names = |tag: u8| if tag == 1 { "image".to_owned() } else { "audio".to_owned() };
        let payload = encode_payload(&events, 2.0, 3, "GPU", names);
        let mut expected = vec![0x93, 0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0, 0x94];
        expected.extend(bytes_of(|w| {
            w.map(1);
            w.entry("type", CLEARED);
            w.map(3);
            w.entry("type", REMOVED);
            w.str("hashes");
            w.array(1);
            w.str("old");
            w.entry("medium", "GPU");
            for (hash, embeds, modality) in [("new", 300, "image"), ("clip", 4, "audio")] {
                w.map(5);
                w.entry("type", STORED);
                w.entry("hash", hash);
                w.str("embeds");
                w.uint(embeds);
                w.entry("modality", modality);
                w.entry("medium", "GPU");
            }
        }));
        expected.push(3);
        assert_eq!(payload, expected);
    }

    #[test]
    fn an_empty_batch_is_an_empty_event_list() {
        let payload = encode_payload(&StepEvents::default(), 0.0, 0, "GPU", |_| String::new());
        assert_eq!(payload, [0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x00]);
    }
}
