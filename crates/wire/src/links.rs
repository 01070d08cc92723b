//! Link ids: a generational slab, so a link is named by an id that never means
//! another link later, and lookups are an index, not a hash.

/// Names one link of a node (to its parent or to one child) for as long as it lives.
///
/// Slots are reused after a link closes; the generation makes an old id stale, so a
/// late event about a closed link can never reach the link that took its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId {
    slot: u32,
    generation: u32,
}

impl LinkId {
    /// The slot, for drivers that index their own tables by it.
    pub fn slot(self) -> usize {
        self.slot as usize
    }
}

impl std::fmt::Display for LinkId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "link {}.{}", self.slot, self.generation)
    }
}

/// A generational slab: values stored under [`LinkId`]s it hands out.
#[derive(Debug)]
pub struct LinkTable<T> {
    entries: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for LinkTable<T> {
    fn default() -> Self {
        LinkTable { entries: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T> LinkTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        LinkTable::default()
    }

    /// Stores `value` under a fresh id.
    pub fn insert(&mut self, value: T) -> LinkId {
        self.len += 1;
        match self.free.pop() {
            Some(slot) => {
                let entry = &mut self.entries[slot as usize];
                entry.0 = entry.0.wrapping_add(1);
                entry.1 = Some(value);
                LinkId { slot, generation: entry.0 }
            }
            None => {
                let slot = self.entries.len() as u32;
                self.entries.push((0, Some(value)));
                LinkId { slot, generation: 0 }
            }
        }
    }

    /// The value of a live id.
    pub fn get(&self, id: LinkId) -> Option<&T> {
        match self.entries.get(id.slot()) {
            Some((generation, Some(v))) if *generation == id.generation => Some(v),
            _ => None,
        }
    }

    /// The value of a live id, mutably.
    pub fn get_mut(&mut self, id: LinkId) -> Option<&mut T> {
        match self.entries.get_mut(id.slot()) {
            Some((generation, Some(v))) if *generation == id.generation => Some(v),
            _ => None,
        }
    }

    /// Takes the value out; the id is stale from now on.
    pub fn remove(&mut self, id: LinkId) -> Option<T> {
        let entry = self.entries.get_mut(id.slot())?;
        if entry.0 != id.generation || entry.1.is_none() {
            return None;
        }
        self.free.push(id.slot);
        self.len -= 1;
        entry.1.take()
    }

    /// Number of live entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every live entry.
    pub fn iter(&self) -> impl Iterator<Item = (LinkId, &T)> {
        self.entries.iter().enumerate().filter_map(|(slot, (generation, v))| {
            v.as_ref().map(|v| (LinkId { slot: slot as u32, generation: *generation }, v))
        })
    }

    /// Every live entry, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (LinkId, &mut T)> {
        self.entries.iter_mut().enumerate().filter_map(|(slot, (generation, v))| {
            v.as_mut().map(|v| (LinkId { slot: slot as u32, generation: *generation }, v))
        })
    }
}

/// Values kept under ids a [`LinkTable`] handed out elsewhere (the core keeps its
/// view of the links its driver made): an index by slot, checked against the whole id.
#[derive(Debug)]
pub struct LinkMap<T> {
    slots: Vec<Option<(LinkId, T)>>,
}

impl<T> Default for LinkMap<T> {
    fn default() -> Self {
        LinkMap { slots: Vec::new() }
    }
}

impl<T> LinkMap<T> {
    /// Stores `value` under `id`, replacing whatever held its slot.
    pub fn insert(&mut self, id: LinkId, value: T) {
        if self.slots.len() <= id.slot() {
            self.slots.resize_with(id.slot() + 1, || None);
        }
        self.slots[id.slot()] = Some((id, value));
    }

    /// The value stored under exactly `id`.
    pub fn get(&self, id: LinkId) -> Option<&T> {
        match self.slots.get(id.slot()) {
            Some(Some((held, v))) if *held == id => Some(v),
            _ => None,
        }
    }

    /// The value stored under exactly `id`, mutably.
    pub fn get_mut(&mut self, id: LinkId) -> Option<&mut T> {
        match self.slots.get_mut(id.slot()) {
            Some(Some((held, v))) if *held == id => Some(v),
            _ => None,
        }
    }

    /// Takes the value stored under exactly `id`.
    pub fn remove(&mut self, id: LinkId) -> Option<T> {
        let slot = self.slots.get_mut(id.slot())?;
        if slot.as_ref().is_some_and(|(held, _)| *held == id) {
            slot.take().map(|(_, v)| v)
        } else {
            None
        }
    }

    /// Every stored entry.
    pub fn iter(&self) -> impl Iterator<Item = (LinkId, &T)> {
        self.slots.iter().filter_map(|s| s.as_ref().map(|(id, v)| (*id, v)))
    }

    /// Every stored entry, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (LinkId, &mut T)> {
        self.slots.iter_mut().filter_map(|s| s.as_mut().map(|(id, v)| (*id, v)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_slot_does_not_answer_to_the_old_id() {
        let mut t = LinkTable::new();
        let a = t.insert("a");
        let b = t.insert("b");
        assert_eq!(t.remove(a), Some("a"));
        let c = t.insert("c");
        assert_eq!(c.slot(), a.slot(), "the slot is reused");
        assert_ne!(c, a);
        assert_eq!(t.get(a), None, "the old id is stale");
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(c), Some(&"c"));
        assert_eq!(t.len(), 2);
        assert_eq!(t.iter().map(|(id, v)| (id, *v)).collect::<Vec<_>>(), [(c, "c"), (b, "b")]);
        let mut m = LinkMap::default();
        m.insert(c, 1);
        assert_eq!(m.get(a), None, "a map checks the whole id");
        assert_eq!(m.remove(c), Some(1));
    }
}
