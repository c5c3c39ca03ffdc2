//! Intrusive doubly linked free lists over arena indices: O(1) push, pop and removal, no
//! allocation after construction.

pub(crate) const NONE: u32 = u32::MAX;

/// Many lists sharing one node arena; a node is in at most one list at a time.
#[derive(Clone, Debug)]
pub(crate) struct FreeLists {
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    owner: Vec<u32>,
}

impl FreeLists {
    pub(crate) fn new(lists: usize, nodes: usize) -> Self {
        FreeLists {
            head: vec![NONE; lists],
            tail: vec![NONE; lists],
            len: vec![0; lists],
            prev: vec![NONE; nodes],
            next: vec![NONE; nodes],
            owner: vec![NONE; nodes],
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
        let o = self.owner[node as usize];
        (o != NONE).then_some(o as usize)
    }

    pub(crate) fn push_front(&mut self, list: usize, node: u32) {
        debug_assert_eq!(
            self.owner[node as usize], NONE,
            "node {node} already listed"
        );
        let h = self.head[list];
        self.prev[node as usize] = NONE;
        self.next[node as usize] = h;
        if h != NONE {
            self.prev[h as usize] = node;
        } else {
            self.tail[list] = node;
        }
        self.head[list] = node;
        self.owner[node as usize] = list as u32;
        self.len[list] += 1;
    }

    pub(crate) fn push_back(&mut self, list: usize, node: u32) {
        debug_assert_eq!(
            self.owner[node as usize], NONE,
            "node {node} already listed"
        );
        let t = self.tail[list];
        self.next[node as usize] = NONE;
        self.prev[node as usize] = t;
        if t != NONE {
            self.next[t as usize] = node;
        } else {
            self.head[list] = node;
        }
        self.tail[list] = node;
        self.owner[node as usize] = list as u32;
        self.len[list] += 1;
    }

    /// Unlinks a node from whatever list holds it; a no-op for an unlisted node.
    pub(crate) fn remove(&mut self, node: u32) {
        let list = self.owner[node as usize];
        if list == NONE {
            return;
        }
        let list = list as usize;
        let (p, n) = (self.prev[node as usize], self.next[node as usize]);
        if p != NONE {
            self.next[p as usize] = n;
        } else {
            self.head[list] = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        } else {
            self.tail[list] = p;
        }
        self.prev[node as usize] = NONE;
        self.next[node as usize] = NONE;
        self.owner[node as usize] = NONE;
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
            cur = self.next[c as usize];
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
