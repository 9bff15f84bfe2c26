//! Byte and bit primitives of the chunk encodings: LEB128 varints, zigzag, and an LSB-first
//! bit writer and reader. The reader checks every bound and reports where input ran out;
//! nothing here panics on corrupt input.

use super::CodecError;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn get_varint(buf: &[u8], pos: &mut usize) -> Result<u64, CodecError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    loop {
        let b = *buf
            .get(*pos)
            .ok_or(CodecError::at(*pos, "truncated varint"))?;
        *pos += 1;
        if shift > 63 {
            return Err(CodecError::at(*pos, "varint too long"));
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
        shift += 7;
    }
}

pub(crate) fn get_u8(buf: &[u8], pos: &mut usize) -> Result<u8, CodecError> {
    let b = *buf.get(*pos).ok_or(CodecError::at(*pos, "truncated"))?;
    *pos += 1;
    Ok(b)
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Appends bits, least significant first, to a byte vector.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, n: 0 }
    }

    /// Writes the low `width` bits of `v` (`width` <= 64).
    pub(crate) fn put(&mut self, v: u64, width: u32) {
        if width == 0 {
            return;
        }
        let v = if width == 64 {
            v
        } else {
            v & ((1u64 << width) - 1)
        };
        let room = 64 - self.n;
        if width < room {
            self.acc |= v << self.n;
            self.n += width;
            return;
        }
        // Fill the accumulator, flush it whole, keep the rest.
        self.acc |= v.checked_shl(self.n).unwrap_or(0);
        self.out.extend_from_slice(&self.acc.to_le_bytes());
        let rest = width - room;
        self.acc = if room == 64 { 0 } else { v >> room };
        self.n = rest;
    }

    /// Flushes the last partial byte(s).
    pub(crate) fn finish(self) {
        let bytes = self.n.div_ceil(8) as usize;
        self.out.extend_from_slice(&self.acc.to_le_bytes()[..bytes]);
    }
}

/// Reads bits written by [`BitWriter`] from a bounded slice.
pub(crate) struct BitReader<'a> {
    buf: &'a [u8],
    /// Offset of `buf` in the whole chunk (for errors).
    base: usize,
    bit: usize,
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        BitReader { buf, base, bit: 0 }
    }

    /// Whole bytes consumed so far.
    pub(crate) fn bytes_read(&self) -> usize {
        self.bit.div_ceil(8)
    }

    /// Reads `width` bits (<= 64).
    pub(crate) fn get(&mut self, width: u32) -> Result<u64, CodecError> {
        if width == 0 {
            return Ok(0);
        }
        let end = self.bit + width as usize;
        if end > self.buf.len() * 8 {
            return Err(CodecError::at(self.base + self.buf.len(), "truncated bits"));
        }
        let mut v = 0u64;
        let mut got = 0u32;
        while got < width {
            let byte = self.buf[self.bit / 8];
            let off = (self.bit % 8) as u32;
            let take = (8 - off).min(width - got);
            let bits = (u64::from(byte) >> off) & ((1u64 << take) - 1);
            v |= bits << got;
            got += take;
            self.bit += take as usize;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip_at_every_width() {
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        let vals: Vec<(u64, u32)> = (0..=64u32)
            .map(|wd| (u64::MAX.checked_shr(64 - wd).unwrap_or(0) ^ 0x5555, wd))
            .collect();
        for &(v, wd) in &vals {
            w.put(v, wd);
        }
        w.finish();
        let mut r = BitReader::new(&out, 0);
        for &(v, wd) in &vals {
            let mask = if wd == 64 { u64::MAX } else { (1u64 << wd) - 1 };
            assert_eq!(r.get(wd).unwrap(), v & mask, "width {wd}");
        }
        assert!(r.get(64).is_err());
    }
}
