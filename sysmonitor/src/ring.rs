//! Fixed-capacity ring buffer for sample history (a few minutes, never growing).

/// Keeps the last `cap` items; pushing past capacity drops the oldest without allocating.
#[derive(Debug, Clone)]
pub struct Ring<T> {
    buf: Vec<T>,
    cap: usize,
    head: usize,
}

impl<T: Clone> Ring<T> {
    /// An empty ring holding at most `cap` items.
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Ring {
            buf: Vec::with_capacity(cap),
            cap,
            head: 0,
        }
    }

    /// Appends `v`, dropping the oldest item when full.
    pub fn push(&mut self, v: T) {
        if self.buf.len() < self.cap {
            self.buf.push(v);
        } else {
            self.buf[self.head] = v;
            self.head = (self.head + 1) % self.cap;
        }
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no item is held.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Most items held.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Oldest to newest.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        let (a, b) = self.buf.split_at(self.head);
        b.iter().chain(a.iter())
    }

    /// The newest item.
    pub fn last(&self) -> Option<&T> {
        if self.buf.is_empty() {
            None
        } else {
            Some(&self.buf[(self.head + self.buf.len() - 1) % self.buf.len()])
        }
    }

    /// Newest `n` items, oldest first.
    pub fn tail(&self, n: usize) -> impl Iterator<Item = &T> {
        self.iter().skip(self.len().saturating_sub(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps_and_keeps_order() {
        let mut r = Ring::new(3);
        assert!(r.last().is_none());
        for i in 0..5 {
            r.push(i);
        }
        assert_eq!(r.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_eq!(r.last(), Some(&4));
        assert_eq!(r.tail(2).copied().collect::<Vec<_>>(), vec![3, 4]);
    }

    proptest! {
        #[test]
        fn equals_the_suffix_of_everything_pushed(cap in 1usize..20, items in proptest::collection::vec(any::<u32>(), 0..100)) {
            let mut r = Ring::new(cap);
            for &i in &items { r.push(i); }
            let want: Vec<u32> = items.iter().copied().skip(items.len().saturating_sub(cap)).collect();
            prop_assert_eq!(r.iter().copied().collect::<Vec<_>>(), want.clone());
            prop_assert_eq!(r.last().copied(), want.last().copied());
            prop_assert!(r.len() <= cap);
        }
    }
}
