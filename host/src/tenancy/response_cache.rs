//! The response cache (Triton's `response_cache`): answers of models and apps that opt in
//! (`response_cache = true` in the manifest), kept per tenant, so no tenant ever sees an
//! answer computed for another, bounded in bytes by the tenant's `response_cache_mib` with
//! the least recently used answer leaving first. The key is a SHA-256 of what decides the
//! answer: the name and version that answer, every input (name, datatype, shape, contents)
//! and, for an app, the request's parameters (a component may read them).

use std::sync::{Mutex, PoisonError};

use lru::LruCache;
use sha2::{Digest, Sha256};

use crate::oip::types::{Payload, ValidInferRequest, ValidTensor};

/// A cached answer: outputs, response parameters, the version that answered.
pub type Cached = (Vec<ValidTensor>, Vec<(String, String)>, String);

pub type Key = [u8; 32];

/// What the cache charges for an entry beside its tensors' contents (key, names, shapes).
const ENTRY_OVERHEAD: usize = 256;

pub struct ResponseCache {
    max_bytes: usize,
    entries: Mutex<Entries>,
}

struct Entries {
    order: LruCache<Key, (Cached, usize)>,
    bytes: usize,
}

impl ResponseCache {
    pub fn new(max_bytes: usize) -> Self {
        Self { max_bytes, entries: Mutex::new(Entries { order: LruCache::unbounded(), bytes: 0 }) }
    }

    /// The answer kept under `key`, made the most recently used.
    pub fn get(&self, key: &Key) -> Option<Cached> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.order.get(key).map(|(cached, _)| cached.clone())
    }

    /// Keep `answer` under `key`, evicting the least recently used answers past the bound;
    /// an answer larger than the whole bound is not kept.
    pub fn put(&self, key: Key, answer: Cached) {
        let size = ENTRY_OVERHEAD
            + answer.0.iter().map(|t| t.name.len() + t.shape.len() * 8 + t.payload.byte_size()).sum::<usize>()
            + answer.1.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if size > self.max_bytes {
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, replaced)) = entries.order.put(key, (answer, size)) {
                entries.bytes -= replaced;
            }
            entries.bytes += size;
            while entries.bytes > self.max_bytes {
                let Some((_, (old, old_size))) = entries.order.pop_lru() else { break };
                entries.bytes -= old_size;
                evicted.push(old);
            }
        }
        // Freed outside the lock.
        drop(evicted);
    }

    /// Forget every answer (a model an app calls may have changed under its name).
    pub fn clear(&self) {
        let entries = {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            entries.bytes = 0;
            std::mem::replace(&mut entries.order, LruCache::unbounded())
        };
        // Freed outside the lock.
        drop(entries);
    }

    /// Bytes of answers kept now.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).bytes
    }
}

/// The key of `request` answered by `name` at `version`; `with_parameters` for apps.
pub fn key(name: &str, version: &str, request: &ValidInferRequest, with_parameters: bool) -> Key {
    let mut hash = Sha256::new();
    // Every variable-length field is preceded by its length: no two requests share a key.
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    };
    field(name.as_bytes());
    field(version.as_bytes());
    for input in &request.inputs {
        field(input.name.as_bytes());
        field(input.datatype.name().as_bytes());
        let shape: Vec<u8> = input.shape.iter().flat_map(|d| d.to_le_bytes()).collect();
        field(&shape);
        match &input.payload {
            Payload::Fixed(bytes) => field(bytes),
            Payload::Bytes(elements) => {
                field(&(elements.len() as u64).to_le_bytes());
                elements.iter().for_each(|element| field(element));
            }
        }
    }
    if with_parameters {
        let mut parameters: Vec<&(String, String)> = request.parameters.iter().collect();
        parameters.sort();
        for (name, value) in parameters {
            field(name.as_bytes());
            field(value.as_bytes());
        }
    }
    hash.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oip::types::Datatype;
    use crate::tensor::ElementType;

    fn request(values: &[u8], parameters: &[(&str, &str)]) -> ValidInferRequest {
        ValidInferRequest {
            id: None,
            inputs: vec![ValidTensor {
                name: "x".into(),
                datatype: Datatype::Fixed(ElementType::U8),
                shape: vec![values.len() as u64],
                payload: Payload::Fixed(values.to_vec()),
            }],
            parameters: parameters.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            requested_outputs: None,
        }
    }

    fn answer(bytes: usize) -> Cached {
        let tensor = ValidTensor {
            name: "y".into(),
            datatype: Datatype::Fixed(ElementType::U8),
            shape: vec![bytes as u64],
            payload: Payload::Fixed(vec![7; bytes]),
        };
        (vec![tensor], Vec::new(), "1".into())
    }

    #[test]
    fn keys_differ_in_anything_that_decides_the_answer() {
        let base = key("m", "1", &request(&[1, 2], &[]), true);
        assert_eq!(base, key("m", "1", &request(&[1, 2], &[]), true));
        assert_ne!(base, key("m", "2", &request(&[1, 2], &[]), true), "version");
        assert_ne!(base, key("n", "1", &request(&[1, 2], &[]), true), "name");
        assert_ne!(base, key("m", "1", &request(&[1, 3], &[]), true), "contents");
        assert_ne!(base, key("m1", "", &request(&[1, 2], &[]), true), "fields cannot run together");
        let with = key("m", "1", &request(&[1, 2], &[("mode", "a")]), true);
        assert_ne!(base, with, "an app's parameters");
        assert_eq!(base, key("m", "1", &request(&[1, 2], &[("mode", "a")]), false), "a model ignores them");
    }

    #[test]
    fn bounded_in_bytes_least_recently_used_first() {
        let cache = ResponseCache::new(3 * (1000 + ENTRY_OVERHEAD + 16));
        for k in 0..3u8 {
            cache.put([k; 32], answer(1000));
        }
        assert!(cache.get(&[0; 32]).is_some(), "touch the oldest");
        cache.put([3; 32], answer(1000));
        assert!(cache.get(&[1; 32]).is_none(), "the least recently used left");
        assert!(cache.get(&[0; 32]).is_some() && cache.get(&[3; 32]).is_some());
        assert!(cache.bytes() <= 3 * (1000 + ENTRY_OVERHEAD + 16));
        cache.put([9; 32], answer(10_000));
        assert!(cache.get(&[9; 32]).is_none(), "larger than the whole bound: not kept");
        assert!(cache.get(&[0; 32]).is_some(), "and nothing evicted for it");
        cache.clear();
        assert!(cache.get(&[0; 32]).is_none() && cache.bytes() == 0);
    }
}
