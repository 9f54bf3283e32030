//! The handle registry: every object the C ABI hands out lives here, under an id that encodes its
//! type tag, a generation and a slot. Looking up an id of the wrong type, a destroyed object or a
//! recycled slot fails cleanly instead of touching freed memory.
//!
//! The registry lock is held only to find or remove an entry; objects are `Arc`s (with a `Mutex`
//! where they mutate), so GPU calls never run under it.

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

/// Registers an object; returns its id (never 0).
pub(crate) fn insert<T: Any + Send + Sync>(tag: Tag, obj: Arc<T>) -> u64 {
    let mut r = registry();
    let slot = match r.free.pop() {
        Some(i) => i,
        None => {
            r.slots.push(Slot { generation: 0, entry: None });
            (r.slots.len() - 1) as u32
        }
    };
    let s = &mut r.slots[slot as usize];
    s.generation = (s.generation + 1) & 0xFF_FFFF;
    if s.generation == 0 {
        s.generation = 1;
    }
    s.entry = Some((tag, obj));
    encode(tag, s.generation, slot)
}

fn invalid(tag: Tag, id: u64) -> Fail {
    Fail(GRAPHSAFE_ERROR_INVALID_HANDLE, format!("invalid {} handle {id:#x} (wrong type, destroyed, or never created)", tag.name()))
}

fn locate(r: &Registry, tag: Tag, id: u64) -> Option<usize> {
    let (t, generation, slot) = ((id >> 56) as u8, ((id >> 32) & 0xFF_FFFF) as u32, (id & 0xFFFF_FFFF) as usize);
    if t != tag as u8 || generation == 0 {
        return None;
    }
    let s = r.slots.get(slot)?;
    match &s.entry {
        Some((et, _)) if *et == tag && s.generation == generation => Some(slot),
        _ => None,
    }
}

/// The object behind `id`, if it is a live `tag` object of type `T`.
pub(crate) fn get<T: Any + Send + Sync>(tag: Tag, id: u64) -> Result<Arc<T>, Fail> {
    let r = registry();
    let slot = locate(&r, tag, id).ok_or_else(|| invalid(tag, id))?;
    let (_, obj) = r.slots[slot].entry.as_ref().expect("located");
    obj.clone().downcast::<T>().map_err(|_| invalid(tag, id))
}

/// Removes the object behind `id` if `allow` approves it; returns it.
pub(crate) fn remove_if<T: Any + Send + Sync>(tag: Tag, id: u64, allow: impl FnOnce(&T) -> Result<(), Fail>) -> Result<Arc<T>, Fail> {
    let mut r = registry();
    let slot = locate(&r, tag, id).ok_or_else(|| invalid(tag, id))?;
    let obj = r.slots[slot].entry.as_ref().expect("located").1.clone().downcast::<T>().map_err(|_| invalid(tag, id))?;
    allow(&obj)?;
    r.slots[slot].entry = None;
    r.free.push(slot as u32);
    Ok(obj)
}
