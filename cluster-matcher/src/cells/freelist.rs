//! Intrusive doubly linked free lists over arena indices: O(1) push, pop and removal, no
//! allocation after construction.

pub(crate) const NONE: u32 = u32::MAX;

/// Many lists sharing one node arena; a node is in at most one list at a time.
#[derive(Clone, Debug)]
pub(crate) struct FreeLists {
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<u32>,
    links: Vec<Link>,
}

/// A node's links, kept together so one cache line serves an unlink.
#[derive(Clone, Copy, Debug)]
struct Link {
    prev: u32,
    next: u32,
    owner: u32,
}

const UNLINKED: Link = Link {
    prev: NONE,
    next: NONE,
    owner: NONE,
};

impl FreeLists {
    pub(crate) fn new(lists: usize, nodes: usize) -> Self {
        FreeLists {
            head: vec![NONE; lists],
            tail: vec![NONE; lists],
            len: vec![0; lists],
            links: vec![UNLINKED; nodes],
        }
    }

    pub(crate) fn len(&self, list: usize) -> u32 {
        self.len[list]
    }

    pub(crate) fn front(&self, list: usize) -> Option<u32> {
        let h = self.head[list];
        (h != NONE).then_some(h)
    }

    /// The list a node is in, if any.
    pub(crate) fn owner(&self, node: u32) -> Option<usize> {
        let o = self.links[node as usize].owner;
        (o != NONE).then_some(o as usize)
    }

    pub(crate) fn push_front(&mut self, list: usize, node: u32) {
        debug_assert_eq!(
            self.links[node as usize].owner, NONE,
            "node {node} already listed"
        );
        let h = self.head[list];
        self.links[node as usize].prev = NONE;
        self.links[node as usize].next = h;
        if h != NONE {
            self.links[h as usize].prev = node;
        } else {
            self.tail[list] = node;
        }
        self.head[list] = node;
        self.links[node as usize].owner = list as u32;
        self.len[list] += 1;
    }

    pub(crate) fn push_back(&mut self, list: usize, node: u32) {
        debug_assert_eq!(
            self.links[node as usize].owner, NONE,
            "node {node} already listed"
        );
        let t = self.tail[list];
        self.links[node as usize].next = NONE;
        self.links[node as usize].prev = t;
        if t != NONE {
            self.links[t as usize].next = node;
        } else {
            self.head[list] = node;
        }
        self.tail[list] = node;
        self.links[node as usize].owner = list as u32;
        self.len[list] += 1;
    }

    /// Unlinks a node from whatever list holds it; a no-op for an unlisted node.
    pub(crate) fn remove(&mut self, node: u32) {
        let list = self.links[node as usize].owner;
        if list == NONE {
            return;
        }
        let list = list as usize;
        let (p, n) = (
            self.links[node as usize].prev,
            self.links[node as usize].next,
        );
        if p != NONE {
            self.links[p as usize].next = n;
        } else {
            self.head[list] = n;
        }
        if n != NONE {
            self.links[n as usize].prev = p;
        } else {
            self.tail[list] = p;
        }
        self.links[node as usize].prev = NONE;
        self.links[node as usize].next = NONE;
        self.links[node as usize].owner = NONE;
        self.len[list] -= 1;
    }

    #[cfg(test)]
    pub(crate) fn pop_front(&mut self, list: usize) -> Option<u32> {
        let h = self.front(list)?;
        self.remove(h);
        Some(h)
    }

    /// Iterates one list front to back.
    pub(crate) fn iter(&self, list: usize) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head[list];
        std::iter::from_fn(move || {
            if cur == NONE {
                return None;
            }
            let c = cur;
            cur = self.links[c as usize].next;
            Some(c)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_remove_keep_order_and_lengths() {
        let mut fl = FreeLists::new(2, 6);
        fl.push_back(0, 1);
        fl.push_back(0, 2);
        fl.push_front(0, 3);
        fl.push_back(1, 4);
        assert_eq!(fl.iter(0).collect::<Vec<_>>(), vec![3, 1, 2]);
        fl.remove(1);
        assert_eq!(fl.iter(0).collect::<Vec<_>>(), vec![3, 2]);
        assert_eq!(fl.len(0), 2);
        assert_eq!(fl.owner(4), Some(1));
        assert_eq!(fl.pop_front(0), Some(3));
        assert_eq!(fl.pop_front(0), Some(2));
        assert_eq!(fl.pop_front(0), None);
        assert_eq!(fl.owner(2), None);
        fl.remove(2);
        assert_eq!(fl.len(1), 1);
    }
}
