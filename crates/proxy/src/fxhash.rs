//! A multiply-rotate hash (rustc's `FxHasher`) for maps looked up on every request whose
//! keys come from the config or from discovery, never from a client: SipHash, the standard
//! one, costs about 300 instructions a lookup of a socket address or a short name, and its
//! resistance to chosen collisions is not needed for such keys. Not for keys a client sends.

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`FxHasher`]s for a `HashMap`.
pub type FxBuild = BuildHasherDefault<FxHasher>;

/// The hash state: one word, mixed by a rotate, a xor and a multiply per word of input.
#[derive(Default)]
pub struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // The table indexes by the low bits: bring the well-mixed high ones down.
        self.0.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn equal_keys_hash_alike_and_different_ones_do_not() {
        let b = FxBuild::default();
        assert_eq!(b.hash_one("app"), b.hash_one(String::from("app")));
        let peers: std::collections::HashSet<u64> = (0..64u16)
            .map(|p| b.hash_one(std::net::SocketAddr::from(([127, 0, 0, 1], 8000 + p))))
            .collect();
        assert_eq!(peers.len(), 64);
        let names: std::collections::HashSet<u64> =
            (0..64).map(|i| b.hash_one(format!("group-{i}"))).collect();
        assert_eq!(names.len(), 64);
    }
}
