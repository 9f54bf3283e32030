//! The handle registry: every object the C ABI hands out lives here, under an id that encodes its
//! type tag, a generation and a slot. Looking up an id of the wrong type, a destroyed object or a
//! recycled slot fails cleanly instead of touching freed memory, and **an id never names a second
//! object**: a slot whose 24-bit generation is used up is retired for good instead of wrapping.
//!
//! The registry lock is a leaf: it is held only to find, insert or remove an entry, no object lock
//! is ever taken inside it, and (the rule of `capi/mod.rs`) no code holding an object lock calls in
//! here. Objects are `Arc`s, so GPU calls never run under it.

use super::{Fail, GRAPHSAFE_ERROR_INVALID_HANDLE};
use once_cell::sync::Lazy;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// Object types, as tags in the top byte of an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Tag {
    Context = 1,
    Stream = 2,
    Workspace = 3,
    Capture = 4,
    Graph = 5,
    GraphExec = 6,
    Buffer = 7,
}

impl Tag {
    fn name(self) -> &'static str {
        match self {
            Tag::Context => "context",
            Tag::Stream => "stream",
            Tag::Workspace => "workspace",
            Tag::Capture => "capture",
            Tag::Graph => "graph",
            Tag::GraphExec => "graph exec",
            Tag::Buffer => "buffer",
        }
    }
}

/// The last generation a slot can carry; a slot freed at it is retired, never reused.
const MAX_GENERATION: u32 = 0xFF_FFFF;

struct Slot {
    generation: u32,
    entry: Option<(Tag, Arc<dyn Any + Send + Sync>)>,
}

#[derive(Default)]
struct Registry {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

static REGISTRY: Lazy<Mutex<Registry>> = Lazy::new(|| Mutex::new(Registry::default()));

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic while holding the lock cannot leave the registry inconsistent (every update is one
    // assignment), so a poisoned lock is still safe to use.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn encode(tag: Tag, generation: u32, slot: u32) -> u64 {
    ((tag as u64) << 56) | (((generation as u64) & 0xFF_FFFF) << 32) | slot as u64
}

impl Registry {
    fn insert(&mut self, tag: Tag, obj: Arc<dyn Any + Send + Sync>) -> Result<u64, Fail> {
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len())
                    .map_err(|_| Fail(super::GRAPHSAFE_ERROR_INVALID_ARGUMENT, "the handle registry is full (2^32 slots)".into()))?;
                self.slots.push(Slot { generation: 0, entry: None });
                i
            }
        };
        let s = &mut self.slots[slot as usize];
        // Free slots always have a generation below the maximum (see `remove`).
        s.generation += 1;
        s.entry = Some((tag, obj));
        Ok(encode(tag, s.generation, slot))
    }

    fn locate(&self, tag: Tag, id: u64) -> Option<usize> {
        let (t, generation, slot) = ((id >> 56) as u8, ((id >> 32) & 0xFF_FFFF) as u32, (id & 0xFFFF_FFFF) as usize);
        if t != tag as u8 || generation == 0 {
            return None;
        }
        let s = self.slots.get(slot)?;
        match &s.entry {
            Some((et, _)) if *et == tag && s.generation == generation => Some(slot),
            _ => None,
        }
    }

    fn remove(&mut self, slot: usize) -> Option<Arc<dyn Any + Send + Sync>> {
        let s = &mut self.slots[slot];
        let obj = s.entry.take().map(|(_, o)| o);
        if s.generation < MAX_GENERATION {
            self.free.push(slot as u32);
        }
        obj
    }
}

/// Registers an object; returns its id (never 0, never one handed out before).
pub(crate) fn insert<T: Any + Send + Sync>(tag: Tag, obj: Arc<T>) -> Result<u64, Fail> {
    registry().insert(tag, obj)
}

fn invalid(tag: Tag, id: u64) -> Fail {
    Fail(GRAPHSAFE_ERROR_INVALID_HANDLE, format!("invalid {} handle {id:#x} (wrong type, destroyed, or never created)", tag.name()))
}

/// The object behind `id`, if it is a live `tag` object of type `T`.
pub(crate) fn get<T: Any + Send + Sync>(tag: Tag, id: u64) -> Result<Arc<T>, Fail> {
    let r = registry();
    let slot = r.locate(tag, id).ok_or_else(|| invalid(tag, id))?;
    let (_, obj) = r.slots[slot].entry.as_ref().ok_or_else(|| invalid(tag, id))?;
    obj.clone().downcast::<T>().map_err(|_| invalid(tag, id))
}

/// Removes the object behind `id` and returns it (the caller drops it outside the registry lock:
/// its destructor may call the driver).
pub(crate) fn remove<T: Any + Send + Sync>(tag: Tag, id: u64) -> Result<Arc<T>, Fail> {
    let obj = {
        let mut r = registry();
        let slot = r.locate(tag, id).ok_or_else(|| invalid(tag, id))?;
        r.remove(slot).ok_or_else(|| invalid(tag, id))?
    };
    obj.downcast::<T>().map_err(|_| invalid(tag, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Registry {
        Registry::default()
    }

    #[test]
    fn a_handle_resolves_only_with_its_own_tag_while_alive() {
        let mut r = fresh();
        let id = r.insert(Tag::Stream, Arc::new(7u32)).unwrap();
        assert!(r.locate(Tag::Stream, id).is_some());
        assert!(r.locate(Tag::Workspace, id).is_none(), "wrong tag");
        assert!(r.locate(Tag::Stream, id ^ (1 << 32)).is_none(), "wrong generation");
        assert!(r.locate(Tag::Stream, (id & !0xFFFF_FFFF) | 99).is_none(), "slot never created");
        assert!(r.locate(Tag::Stream, 0).is_none());
        let slot = r.locate(Tag::Stream, id).unwrap();
        assert!(r.remove(slot).is_some());
        assert!(r.locate(Tag::Stream, id).is_none(), "destroyed");
    }

    #[test]
    fn a_recycled_slot_gets_a_new_id_and_the_old_one_stays_dead() {
        let mut r = fresh();
        let a = r.insert(Tag::Buffer, Arc::new(1u8)).unwrap();
        let slot = r.locate(Tag::Buffer, a).unwrap();
        r.remove(slot);
        let b = r.insert(Tag::Buffer, Arc::new(2u8)).unwrap();
        assert_eq!(b & 0xFFFF_FFFF, a & 0xFFFF_FFFF, "the slot is reused");
        assert_ne!(a, b);
        assert!(r.locate(Tag::Buffer, a).is_none(), "the old id does not resolve to the new object");
        assert!(r.locate(Tag::Buffer, b).is_some());
    }

    #[test]
    fn a_slot_whose_generations_are_used_up_is_retired_instead_of_wrapping() {
        let mut r = fresh();
        let first = r.insert(Tag::Graph, Arc::new(0u8)).unwrap();
        let slot = r.locate(Tag::Graph, first).unwrap();
        // Fast-forward the slot to its last generation, as 16,777,214 create/destroy cycles would.
        r.slots[slot].generation = MAX_GENERATION - 1;
        r.remove(slot);
        let last = r.insert(Tag::Graph, Arc::new(1u8)).unwrap();
        assert_eq!(((last >> 32) & 0xFF_FFFF) as u32, MAX_GENERATION);
        assert_eq!(last & 0xFFFF_FFFF, slot as u64);
        r.remove(r.locate(Tag::Graph, last).unwrap());
        // The retired slot is not handed out again: every later id is new, and the old ones stay dead.
        let mut seen = vec![first, last];
        for i in 0..1000u32 {
            let id = r.insert(Tag::Graph, Arc::new(i)).unwrap();
            assert_ne!(id & 0xFFFF_FFFF, slot as u64, "retired slot reused");
            assert!(!seen.contains(&id));
            seen.push(id);
            r.remove(r.locate(Tag::Graph, id).unwrap());
        }
        assert!(r.locate(Tag::Graph, first).is_none() && r.locate(Tag::Graph, last).is_none());
    }

    #[test]
    fn a_full_create_destroy_cycle_count_never_repeats_an_id() {
        // 2^24 cycles on one slot, then past it: ids stay unique (the wrap this replaces).
        let mut r = fresh();
        let mut prev = std::collections::HashSet::new();
        let first = r.insert(Tag::Context, Arc::new(())).unwrap();
        let slot = r.locate(Tag::Context, first).unwrap();
        r.remove(slot);
        r.slots[slot].generation = MAX_GENERATION - 3;
        for _ in 0..8 {
            let id = r.insert(Tag::Context, Arc::new(())).unwrap();
            assert!(prev.insert(id), "id {id:#x} handed out twice");
            r.remove(r.locate(Tag::Context, id).unwrap());
        }
    }
}
