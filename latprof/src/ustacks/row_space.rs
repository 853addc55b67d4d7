//! Where in the kernel's unwind table a file's rows go. Rows of files no live process maps
//! are given back (`Tables::reclaim`) and given again, first fit: before, the table only
//! filled, so that any user who ran enough binaries once left every later process with
//! truncated backtraces for the rest of the run (issue 53, R3).

/// The rows given and free: every row below `next` is in a given range or in `free`.
#[derive(Debug, Default)]
pub struct RowSpace {
    next: u32,
    /// Free ranges below `next` as (first, count), sorted, none touching another.
    free: Vec<(u32, u32)>,
}

impl RowSpace {
    /// `count` rows that all lie below `below` (the users' part of the table is its first
    /// rows); `None` where no such room is left.
    pub fn take(&mut self, count: u32, below: u32) -> Option<u32> {
        if count == 0 {
            return None;
        }
        let fits = self.free.iter().position(|&(first, n)| {
            n >= count && first.checked_add(count).is_some_and(|end| end <= below)
        });
        if let Some(i) = fits {
            let (first, n) = self.free[i];
            if n == count {
                self.free.remove(i);
            } else {
                self.free[i] = (first + count, n - count);
            }
            return Some(first);
        }
        let end = self.next.checked_add(count)?;
        if end > below {
            return None;
        }
        let first = self.next;
        self.next = end;
        Some(first)
    }

    /// Gives back the rows `first..first + count`, given before.
    pub fn give_back(&mut self, first: u32, count: u32) {
        if count == 0 {
            return;
        }
        let at = self.free.partition_point(|&(f, _)| f < first);
        self.free.insert(at, (first, count));
        // Joined with its neighbours where they touch.
        if at + 1 < self.free.len() && first + count == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == first {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
        // A free range that ends the given rows lowers their end.
        if let Some(&(f, n)) = self.free.last()
            && f + n == self.next
        {
            self.next = f;
            self.free.pop();
        }
    }

    /// Rows given now.
    #[must_use]
    pub fn given(&self) -> u32 {
        self.next - self.free.iter().map(|&(_, n)| n).sum::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_given_back_are_given_again() {
        let mut s = RowSpace::default();
        let a = s.take(100, 1000).unwrap();
        let b = s.take(200, 1000).unwrap();
        let c = s.take(300, 1000).unwrap();
        assert_eq!((a, b, c), (0, 100, 300));
        assert_eq!(s.take(401, 1000), None, "only 400 left");
        s.give_back(b, 200);
        assert_eq!(s.given(), 400);
        // First fit: the hole, then past the end.
        assert_eq!(s.take(150, 1000), Some(100));
        assert_eq!(s.take(100, 1000), Some(600));
        assert_eq!(s.given(), 650);
    }

    #[test]
    fn neighbours_join_and_the_end_comes_back() {
        let mut s = RowSpace::default();
        let firsts: Vec<u32> = (0..4).map(|_| s.take(10, 100).unwrap()).collect();
        s.give_back(firsts[1], 10);
        s.give_back(firsts[2], 10);
        // One hole of 20: a range of 20 fits in it.
        assert_eq!(s.take(20, 100), Some(10));
        s.give_back(10, 20);
        s.give_back(firsts[3], 10);
        s.give_back(firsts[0], 10);
        assert_eq!((s.given(), s.next, s.free.len()), (0, 0, 0));
    }

    #[test]
    fn a_limit_keeps_rows_above_it_for_others() {
        let mut s = RowSpace::default();
        assert_eq!(s.take(75, 100), Some(0));
        assert_eq!(s.take(30, 100), None);
        // Root may go past the users' limit.
        assert_eq!(s.take(30, 200), Some(75));
        s.give_back(0, 75);
        // The hole is below the limit: a user's file fits there again.
        assert_eq!(s.take(60, 100), Some(0));
    }
}
