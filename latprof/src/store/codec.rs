//! The bytes inside a frame: LEB128 varints, length-prefixed strings. The decoder checks every
//! length against what is left, so damaged input is an error, never a panic or a huge allocation,
//! and charges what the decoded items will take in memory to a budget: a hostile file whose few
//! bytes declare millions of items (two bytes on disk, thirty-two in memory) runs out of budget
//! instead of memory.

use super::FormatError;

#[derive(Default)]
pub struct Enc {
    pub buf: Vec<u8>,
}

impl Enc {
    pub fn u64(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }

    pub fn u32(&mut self, v: u32) {
        self.u64(u64::from(v));
    }

    pub fn usize(&mut self, v: usize) {
        self.u64(v as u64);
    }

    pub fn bool(&mut self, v: bool) {
        self.buf.push(u8::from(v));
    }

    pub fn str(&mut self, s: &str) {
        self.usize(s.len());
        self.buf.extend_from_slice(s.as_bytes());
    }
}

pub struct Dec<'a> {
    data: &'a [u8],
    pos: usize,
    /// Bytes of memory the decoded items may still take.
    budget: u64,
    /// Bytes charged so far.
    charged: u64,
}

impl<'a> Dec<'a> {
    /// A decoder for data latprof has decoded within a budget before (or wrote itself).
    #[must_use]
    pub fn new(data: &'a [u8]) -> Self {
        Self::with_budget(data, u64::MAX)
    }

    /// A decoder whose items may take at most `budget` bytes of memory.
    #[must_use]
    pub fn with_budget(data: &'a [u8], budget: u64) -> Self {
        Self {
            data,
            pos: 0,
            budget,
            charged: 0,
        }
    }

    /// Bytes of memory the items decoded so far take (an estimate: item sizes, not the
    /// allocator's rounding).
    #[must_use]
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Charges `bytes` of memory that decoded items take beyond what [`Self::len`] and
    /// [`Self::str`] charged (a string copied into many items).
    pub fn charge(&mut self, bytes: u64) -> Result<(), FormatError> {
        self.charged = self.charged.saturating_add(bytes);
        if self.charged > self.budget {
            return Err(FormatError::TooBig);
        }
        Ok(())
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u64(&mut self) -> Result<u64, FormatError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .data
                .get(self.pos)
                .ok_or(FormatError::Malformed("varint past the end"))?;
            self.pos += 1;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(FormatError::Malformed("varint overflows 64 bits"));
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(FormatError::Malformed("varint longer than 10 bytes"))
    }

    pub fn u32(&mut self) -> Result<u32, FormatError> {
        u32::try_from(self.u64()?).map_err(|_| FormatError::Malformed("value over 32 bits"))
    }

    pub fn bool(&mut self) -> Result<bool, FormatError> {
        match self.u64()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FormatError::Malformed("boolean not 0 or 1")),
        }
    }

    /// A count of items that each take at least `min_item_bytes` in the data and `item_size`
    /// bytes in memory: bounded by what is left of the data, and charged to the budget.
    pub fn len(&mut self, min_item_bytes: usize, item_size: usize) -> Result<usize, FormatError> {
        let n = usize::try_from(self.u64()?).map_err(|_| FormatError::Malformed("length"))?;
        let left = self.data.len() - self.pos;
        if n.saturating_mul(min_item_bytes.max(1)) > left {
            return Err(FormatError::Malformed("length past the end"));
        }
        self.charge((n as u64).saturating_mul(item_size as u64))?;
        Ok(n)
    }

    /// A string, its control characters escaped: names in a recording come from whoever
    /// made the file, and every view prints them (see [`crate::text::printable`]).
    pub fn str(&mut self) -> Result<String, FormatError> {
        let n = self.len(1, 1)?;
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        let s =
            std::str::from_utf8(bytes).map_err(|_| FormatError::Malformed("string not UTF-8"))?;
        let s = crate::text::printable(s).into_owned();
        // Escaping grows a string (one byte to four): the growth is charged too.
        self.charge((s.len() - n) as u64)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_at_the_edges() {
        let values = [
            0,
            1,
            127,
            128,
            300,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ];
        let mut e = Enc::default();
        for v in values {
            e.u64(v);
        }
        e.str("hrtimer_nanosleep [mod]");
        e.bool(true);
        let mut d = Dec::new(&e.buf);
        for v in values {
            assert_eq!(d.u64().unwrap(), v);
        }
        assert_eq!(d.str().unwrap(), "hrtimer_nanosleep [mod]");
        assert!(d.bool().unwrap());
        assert!(d.is_empty());
        assert!(d.charged() > 0);
        assert!(d.u64().is_err());
    }

    #[test]
    fn damaged_input_is_an_error() {
        // 11 continuation bytes.
        assert!(Dec::new(&[0xff; 11]).u64().is_err());
        // Bit 64 set.
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert!(Dec::new(&over).u64().is_err());
        // A string longer than the data.
        assert!(Dec::new(&[5, b'a']).str().is_err());
        // A count that cannot fit.
        assert!(Dec::new(&[0xff, 0xff, 0x03]).len(8, 8).is_err());
        // A count that fits the data but not the memory budget.
        let mut e = Enc::default();
        e.usize(1000);
        e.buf.extend([0; 1000]);
        assert_eq!(
            Dec::with_budget(&e.buf, 31_999).len(1, 32),
            Err(FormatError::TooBig)
        );
        assert_eq!(Dec::with_budget(&e.buf, 32_000).len(1, 32), Ok(1000));
        assert!(Dec::new(&[2]).bool().is_err());
    }
}
