//! Contents of emulated device memory: sparse 4 KiB pages, zero until written, so huge
//! allocations cost nothing until data is copied in.

use std::collections::HashMap;

const PAGE: u64 = 4096;

/// Sparse byte store addressed by device address.
#[derive(Default)]
pub struct MemStore {
    pages: HashMap<u64, Box<[u8; PAGE as usize]>>,
}

impl MemStore {
    /// Copies `data` to `addr`.
    pub fn write(&mut self, addr: u64, data: &[u8]) {
        let mut off = 0usize;
        while off < data.len() {
            let a = addr + off as u64;
            let (pno, po) = (a / PAGE, (a % PAGE) as usize);
            let n = (PAGE as usize - po).min(data.len() - off);
            let page = self.pages.entry(pno).or_insert_with(|| Box::new([0; PAGE as usize]));
            page[po..po + n].copy_from_slice(&data[off..off + n]);
            off += n;
        }
    }

    /// Copies from `addr` into `out` (unwritten bytes read as zero).
    pub fn read(&self, addr: u64, out: &mut [u8]) {
        let mut off = 0usize;
        while off < out.len() {
            let a = addr + off as u64;
            let (pno, po) = (a / PAGE, (a % PAGE) as usize);
            let n = (PAGE as usize - po).min(out.len() - off);
            match self.pages.get(&pno) {
                Some(p) => out[off..off + n].copy_from_slice(&p[po..po + n]),
                None => out[off..off + n].fill(0),
            }
            off += n;
        }
    }

    /// Sets `len` bytes at `addr` to `v`.
    pub fn fill(&mut self, addr: u64, len: u64, v: u8) {
        let mut off = 0u64;
        while off < len {
            let a = addr + off;
            let (pno, po) = (a / PAGE, a % PAGE);
            let n = (PAGE - po).min(len - off);
            if v == 0 && po == 0 && n == PAGE {
                self.pages.remove(&pno);
            } else if v != 0 || self.pages.contains_key(&pno) {
                let page = self.pages.entry(pno).or_insert_with(|| Box::new([0; PAGE as usize]));
                page[po as usize..(po + n) as usize].fill(v);
            }
            off += n;
        }
    }

    /// Device-to-device copy (handles overlap).
    pub fn copy(&mut self, dst: u64, src: u64, len: u64) {
        let mut buf = vec![0u8; len as usize];
        self.read(src, &mut buf);
        self.write(dst, &buf);
    }

    /// Forgets a freed range.
    pub fn discard(&mut self, addr: u64, len: u64) {
        self.fill(addr, len, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_across_pages() {
        let mut m = MemStore::default();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        m.write(4000, &data);
        let mut out = vec![0u8; 10_000];
        m.read(4000, &mut out);
        assert_eq!(out, data);
        m.fill(4090, 20, 7);
        m.read(4090, &mut out[..20]);
        assert!(out[..20].iter().all(|&b| b == 7));
        m.copy(100_000, 4000, 100);
        let mut o2 = vec![0u8; 100];
        m.read(100_000, &mut o2);
        assert_eq!(o2[..10], data[..10]);
        m.discard(0, 1 << 20);
        m.read(4000, &mut out);
        assert!(out.iter().all(|&b| b == 0));
        assert!(m.pages.is_empty());
    }
}
