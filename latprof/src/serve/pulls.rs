//! Each scraper's previous profile pull, so that its next one continues from it.
//!
//! Fleet scrapers pull a profile of `seconds` shorter than their interval: Parca asks for
//! `seconds = interval - 1`, Alloy for a 14 s delta every 15 s. Profiles of the trailing
//! `seconds` would leave a tenth or a fifteenth of all off-CPU time out, silently. A pull here
//! holds the reads since the same scraper's previous pull instead: every sleep once, no gap and
//! no overlap, whatever its `seconds`. A first pull, or one whose previous pull the window no
//! longer reaches (over `MAX_SECONDS` ago), holds the trailing `seconds`.
//!
//! A scraper is told by who it is (`peer::Peer::identity`: the user owning its socket on this
//! machine, its address from elsewhere), then by its `scraper=` query value where it sends
//! one, else by its User-Agent: a local user who sends the real scraper's name or agent is
//! another scraper, and cannot move the real one's place. At most `MAX_SCRAPERS` are
//! remembered, `MAX_PER_IDENTITY` of one identity (its own least recent is forgotten for its
//! next), and a scraper that pulled within `MAX_SECONDS` is never forgotten for a newcomer:
//! with no room, the newcomer's pulls are each a first pull (the trailing `seconds`).

use std::{collections::HashMap, sync::Mutex};

use super::state::MAX_SECONDS;

/// Scrapers remembered at most.
pub const MAX_SCRAPERS: usize = 64;
/// Scrapers of one identity remembered at most.
pub const MAX_PER_IDENTITY: usize = 8;

/// The longest scraper name kept (a longer one is cut: any client names itself).
const MAX_NAME: usize = 200;

/// Which reads a pull holds: those taken after `after_ns` (CLOCK_MONOTONIC), up to the latest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub after_ns: u64,
    /// Whether it continues the scraper's previous pull (false: a first pull, the trailing
    /// `seconds`).
    pub continued: bool,
}

/// The scrapers' previous pulls.
#[derive(Debug, Default)]
pub struct Pulls {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Per scraper (identity, name): the latest read its previous pull held, and when it
    /// pulled (a sequence number: the least recent is forgotten first; and the time).
    last: HashMap<(String, String), Last>,
    pulls: u64,
}

#[derive(Clone, Copy, Debug)]
struct Last {
    through: u64,
    seq: u64,
    at_ns: u64,
}

impl Pulls {
    /// The span scraper `who` gets now, asking for `seconds`: the reads since its previous
    /// pull where the window (its reads taken after `window_from_ns`) still holds them all,
    /// else those of the trailing `seconds` before `now_ns`. Remembers that this pull held
    /// the reads up to `latest_ns`.
    pub fn next(
        &self,
        identity: &str,
        name: &str,
        seconds: u32,
        now_ns: u64,
        window_from_ns: u64,
        latest_ns: u64,
    ) -> Span {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.pulls += 1;
        let seq = state.pulls;
        let cut = |s: &str| -> String { s.chars().take(MAX_NAME).collect() };
        let key = (cut(identity), cut(name));
        let span = match state.last.get(&key) {
            Some(last) if last.through >= window_from_ns => Span {
                after_ns: last.through,
                continued: true,
            },
            _ => Span {
                after_ns: now_ns.saturating_sub(u64::from(seconds) * 1_000_000_000),
                continued: false,
            },
        };
        if !state.last.contains_key(&key) && !state.make_room(&key.0, now_ns) {
            return span;
        }
        // A pull held no read after the latest: the next one starts there.
        let through = latest_ns.max(span.after_ns);
        state.last.insert(
            key,
            Last {
                through,
                seq,
                at_ns: now_ns,
            },
        );
        span
    }
}

impl State {
    /// Room for one more scraper of `identity`: its own least recent is forgotten where it
    /// has `MAX_PER_IDENTITY`; where all are taken, the least recent that has not pulled for
    /// `MAX_SECONDS`. False where there is none to forget.
    fn make_room(&mut self, identity: &str, now_ns: u64) -> bool {
        let least_recent = |state: &Self, pick: &dyn Fn(&(String, String), &Last) -> bool| {
            state
                .last
                .iter()
                .filter(|(k, l)| pick(k, l))
                .min_by_key(|(_, l)| l.seq)
                .map(|(k, _)| k.clone())
        };
        let own = self.last.keys().filter(|(i, _)| i == identity).count();
        if own >= MAX_PER_IDENTITY {
            if let Some(k) = least_recent(self, &|(i, _), _| i == identity) {
                self.last.remove(&k);
            }
            return true;
        }
        if self.last.len() < MAX_SCRAPERS {
            return true;
        }
        let stale = u64::from(MAX_SECONDS) * 1_000_000_000;
        match least_recent(self, &|_, l| now_ns.saturating_sub(l.at_ns) > stale) {
            Some(k) => {
                self.last.remove(&k);
                true
            }
            None => false,
        }
    }
}

/// The name a pull's scraper goes by among its identity's: its `scraper` query value, else
/// its User-Agent.
#[must_use]
pub fn scraper_name(query: Option<&str>, agent: &str) -> String {
    let named = query.unwrap_or("").split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (super::decode(key) == "scraper").then(|| super::decode(value))
    });
    match named {
        Some(name) => format!("scraper={name}"),
        None => format!("agent={agent}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_scraper_continues_from_its_previous_pull() {
        let pulls = Pulls::default();
        let next = |name: &str, seconds, now, from, latest| {
            pulls.next("uid 0", name, seconds, now, from, latest)
        };
        // Parca's pull: seconds = interval - 1 (9 of every 10 s).
        let first = next("parca", 9, 100 * S, 0, 100 * S);
        assert_eq!(
            first,
            Span {
                after_ns: 91 * S,
                continued: false
            }
        );
        let second = next("parca", 9, 110 * S, 0, 110 * S);
        assert_eq!(
            second,
            Span {
                after_ns: 100 * S,
                continued: true
            }
        );
        // Another scraper keeps its own place.
        assert_eq!(next("alloy", 14, 112 * S, 0, 112 * S).after_ns, 98 * S);
        assert_eq!(next("parca", 9, 120 * S, 0, 119 * S).after_ns, 110 * S);
        // Past the window's reach: a first pull again.
        let late = next("parca", 9, 500 * S, 200 * S, 500 * S);
        assert_eq!(
            late,
            Span {
                after_ns: 491 * S,
                continued: false
            }
        );
    }

    /// R8: a local user who pulled with the real scraper's name took its place (the real
    /// one's next profile covered the time since the user's pull), and 70 made-up names
    /// evicted it.
    #[test]
    fn another_user_neither_takes_nor_evicts_a_scrapers_place() {
        let pulls = Pulls::default();
        let real = |now| pulls.next("uid 0", "scraper=parca", 9, now, 0, now);
        real(100 * S);
        // The user sends the same name: its own place, not the real one's.
        let forged = pulls.next("uid 65534", "scraper=parca", 9, 103 * S, 0, 103 * S);
        assert!(!forged.continued);
        // And many names: only its own are forgotten for its next.
        for i in 0..70 {
            pulls.next("uid 65534", &format!("scraper={i}"), 9, 104 * S, 0, 104 * S);
        }
        let state = pulls.state.lock().unwrap();
        let own = state.last.keys().filter(|(i, _)| i == "uid 65534").count();
        assert_eq!(own, MAX_PER_IDENTITY);
        drop(state);
        assert_eq!(
            real(110 * S),
            Span {
                after_ns: 100 * S,
                continued: true
            },
            "the real scraper's pull covers all since its own last"
        );
    }

    #[test]
    fn scrapers_are_bounded_and_recent_ones_never_forgotten() {
        let pulls = Pulls::default();
        for i in 0..MAX_SCRAPERS {
            pulls.next(&format!("10.0.0.{i}"), "agent=Go", 10, 100 * S, 0, 100 * S);
        }
        // All recent: a newcomer is served, not remembered, and forgets no one.
        let new = pulls.next("10.0.1.1", "agent=Go", 10, 101 * S, 0, 101 * S);
        assert!(!new.continued);
        assert!(
            !pulls
                .next("10.0.1.1", "agent=Go", 10, 102 * S, 0, 102 * S)
                .continued
        );
        assert!(
            pulls
                .next("10.0.0.0", "agent=Go", 10, 103 * S, 0, 103 * S)
                .continued
        );
        // Past MAX_SECONDS, the least recent stale one makes room.
        let later = 103 * S + u64::from(MAX_SECONDS) * S + S;
        pulls.next("10.0.0.0", "agent=Go", 10, later - S, 0, later - S);
        pulls.next("10.0.1.1", "agent=Go", 10, later, 0, later);
        assert!(
            pulls
                .next("10.0.1.1", "agent=Go", 10, later + S, 0, later)
                .continued
        );
        assert!(
            pulls
                .next("10.0.0.0", "agent=Go", 10, later + S, 0, later)
                .continued
        );
        assert_eq!(pulls.state.lock().unwrap().last.len(), MAX_SCRAPERS);
        let long = "x".repeat(10_000);
        pulls.next(&long, &long, 10, later, 0, later);
        assert!(
            pulls
                .state
                .lock()
                .unwrap()
                .last
                .keys()
                .all(|(i, n)| i.len() <= MAX_NAME && n.len() <= MAX_NAME)
        );
    }

    #[test]
    fn scrapers_are_named_by_query_or_agent() {
        assert_eq!(
            scraper_name(Some("seconds=9&scraper=parca%2D1"), "Go"),
            "scraper=parca-1"
        );
        assert_eq!(
            scraper_name(Some("seconds=9"), "Alloy/v1.5"),
            "agent=Alloy/v1.5"
        );
        assert_eq!(scraper_name(None, ""), "agent=");
    }
}
