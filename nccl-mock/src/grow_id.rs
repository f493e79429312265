//! The layout of a grow id (`ncclCommGetUniqueId`'s answer): a unique id marked as a grow
//! id and carrying the size of the communicator it grows. A leaf: the rendezvous that
//! remembers failed grows and the grow itself both read it.

/// Bytes 120..124 of a grow id; the old size follows (u32, little-endian).
pub(crate) const GROW_MARK: &[u8; 4] = b"GROW";

/// Whether `key` is a grow id (made by `ncclCommGetUniqueId`).
pub(crate) fn is_grow_id(key: &[u8]) -> bool {
    key.len() == 128 && &key[120..124] == GROW_MARK
}

/// The size of the communicator a grow id grows.
pub(crate) fn old_size(key: &[u8]) -> Option<usize> {
    let b: [u8; 4] = key.get(124..128)?.try_into().ok()?;
    is_grow_id(key).then(|| u32::from_le_bytes(b) as usize)
}
