//! The handle registry: every object the C ABI hands out lives here, under an id that encodes its
//! type tag, the library's load epoch, a generation and a slot. Looking up an id of the wrong type,
//! a destroyed object, a recycled slot or another load of the library fails cleanly instead of
//! touching freed memory, and **an id never names a second object**: a slot whose 20-bit
//! generation is used up is retired for good instead of wrapping, and a library unloaded
//! (`dlclose`) and loaded again, whose registry starts afresh, hands out ids of another epoch.
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
const MAX_GENERATION: u32 = 0xF_FFFF;
/// Slots an id can name (24 bits).
const MAX_SLOTS: usize = 1 << 24;
/// Epochs an id can carry (12 bits, 0 unused).
const MAX_EPOCH: u32 = 0xFFF;

/// This load's epoch: unique in the process while it lives, across loads of the library (a
/// `dlclose` that unloads it, then a `dlopen`, runs these statics afresh, so a counter here would
/// start again) and across copies of it linked into several shared objects.
///
/// A pthread key is a small number (glibc: below 1024) unique among the process's live keys: each
/// load creates one and never deletes it, so no later load is handed the same. If the process has
/// no key left, the epoch is drawn at random above the keys' range instead (unique only with high
/// probability).
fn epoch() -> u32 {
    static EPOCH: Lazy<u32> = Lazy::new(|| {
        const KEYS: u32 = 1024;
        match crate::sys::process::leak_pthread_key() {
            Some(key) if key < KEYS => key + 1,
            _ => {
                let noise = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32)
                    ^ std::process::id().rotate_left(16)
                    ^ (&EPOCH as *const Lazy<u32> as usize as u32);
                KEYS + 1 + noise % (MAX_EPOCH - KEYS)
            }
        }
    });
    *EPOCH
}

struct Slot {
    generation: u32,
    entry: Option<(Tag, Arc<dyn Any + Send + Sync>)>,
}

struct Registry {
    epoch: u32,
    slots: Vec<Slot>,
    free: Vec<u32>,
}

impl Default for Registry {
    fn default() -> Registry {
        Registry { epoch: epoch(), slots: Vec::new(), free: Vec::new() }
    }
}

static REGISTRY: Lazy<Mutex<Registry>> = Lazy::new(|| Mutex::new(Registry::default()));

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // A panic while holding the lock cannot leave the registry inconsistent (every update is one
    // assignment), so a poisoned lock is still safe to use.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// An id: the tag (8 bits), the load epoch (12), the generation (20), the slot (24).
fn encode(tag: Tag, epoch: u32, generation: u32, slot: u32) -> u64 {
    ((tag as u64) << 56) | (((epoch & MAX_EPOCH) as u64) << 44) | (((generation & MAX_GENERATION) as u64) << 24) | (slot as u64 & (MAX_SLOTS as u64 - 1))
}

impl Registry {
    fn insert(&mut self, tag: Tag, obj: Arc<dyn Any + Send + Sync>) -> Result<u64, Fail> {
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&i| (i as usize) < MAX_SLOTS)
                    .ok_or_else(|| Fail(super::GRAPHSAFE_ERROR_INVALID_ARGUMENT, "the handle registry is full (2^24 slots)".into()))?;
                self.slots.push(Slot { generation: 0, entry: None });
                i
            }
        };
        let s = &mut self.slots[slot as usize];
        // Free slots always have a generation below the maximum (see `remove`).
        s.generation += 1;
        s.entry = Some((tag, obj));
        Ok(encode(tag, self.epoch, s.generation, slot))
    }

    fn locate(&self, tag: Tag, id: u64) -> Option<usize> {
        let (t, epoch) = ((id >> 56) as u8, ((id >> 44) as u32) & MAX_EPOCH);
        let (generation, slot) = (((id >> 24) as u32) & MAX_GENERATION, (id as usize) & (MAX_SLOTS - 1));
        if t != tag as u8 || epoch != self.epoch || generation == 0 {
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

    fn slot_of(id: u64) -> u64 {
        id & (MAX_SLOTS as u64 - 1)
    }

    fn generation_of(id: u64) -> u32 {
        ((id >> 24) as u32) & MAX_GENERATION
    }

    #[test]
    fn a_handle_resolves_only_with_its_own_tag_while_alive() {
        let mut r = fresh();
        let id = r.insert(Tag::Stream, Arc::new(7u32)).unwrap();
        assert!(r.locate(Tag::Stream, id).is_some());
        assert!(r.locate(Tag::Workspace, id).is_none(), "wrong tag");
        assert!(r.locate(Tag::Stream, id ^ (1 << 24)).is_none(), "wrong generation");
        assert!(r.locate(Tag::Stream, id ^ (1 << 44)).is_none(), "another load's epoch");
        assert!(r.locate(Tag::Stream, (id & !(MAX_SLOTS as u64 - 1)) | 99).is_none(), "slot never created");
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
        assert_eq!(slot_of(b), slot_of(a), "the slot is reused");
        assert_ne!(a, b);
        assert!(r.locate(Tag::Buffer, a).is_none(), "the old id does not resolve to the new object");
        assert!(r.locate(Tag::Buffer, b).is_some());
    }

    #[test]
    fn a_slot_whose_generations_are_used_up_is_retired_instead_of_wrapping() {
        let mut r = fresh();
        let first = r.insert(Tag::Graph, Arc::new(0u8)).unwrap();
        let slot = r.locate(Tag::Graph, first).unwrap();
        // Fast-forward the slot to its last generation, as 1,048,574 create/destroy cycles would.
        r.slots[slot].generation = MAX_GENERATION - 1;
        r.remove(slot);
        let last = r.insert(Tag::Graph, Arc::new(1u8)).unwrap();
        assert_eq!(generation_of(last), MAX_GENERATION);
        assert_eq!(slot_of(last), slot as u64);
        r.remove(r.locate(Tag::Graph, last).unwrap());
        // The retired slot is not handed out again: every later id is new, and the old ones stay dead.
        let mut seen = vec![first, last];
        for i in 0..1000u32 {
            let id = r.insert(Tag::Graph, Arc::new(i)).unwrap();
            assert_ne!(slot_of(id), slot as u64, "retired slot reused");
            assert!(!seen.contains(&id));
            seen.push(id);
            r.remove(r.locate(Tag::Graph, id).unwrap());
        }
        assert!(r.locate(Tag::Graph, first).is_none() && r.locate(Tag::Graph, last).is_none());
    }

    #[test]
    fn a_full_create_destroy_cycle_count_never_repeats_an_id() {
        // 2^20 cycles on one slot, then past it: ids stay unique (the wrap this replaces).
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

    #[test]
    fn ids_carry_this_loads_epoch() {
        let mut r = fresh();
        let id = r.insert(Tag::Buffer, Arc::new(())).unwrap();
        let e = ((id >> 44) as u32) & MAX_EPOCH;
        assert!(e != 0 && e == epoch(), "epoch {e} in {id:#x}");
        // A registry of another load (another epoch) does not resolve it, with the same slot and
        // generation.
        let mut other = Registry { epoch: e % MAX_EPOCH + 1, slots: Vec::new(), free: Vec::new() };
        let theirs = other.insert(Tag::Buffer, Arc::new(())).unwrap();
        assert_eq!((slot_of(theirs), generation_of(theirs)), (slot_of(id), generation_of(id)));
        assert_ne!(theirs, id);
        assert!(other.locate(Tag::Buffer, id).is_none() && r.locate(Tag::Buffer, theirs).is_none());
    }
}
