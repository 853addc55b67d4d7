//! Each scraper's previous profile pull, so that its next one continues from it.
//!
//! Fleet scrapers pull a profile of `seconds` shorter than their interval: Parca asks for
//! `seconds = interval - 1`, Alloy for a 14 s delta every 15 s. Profiles of the trailing
//! `seconds` would leave a tenth or a fifteenth of all off-CPU time out, silently. A pull here
//! holds the reads since the same scraper's previous pull instead: every sleep once, no gap and
//! no overlap, whatever its `seconds`. A first pull, or one whose previous pull the window no
//! longer reaches (over `MAX_SECONDS` ago), holds the trailing `seconds`.
//!
//! A scraper is told by its `scraper=` query value where it sends one, else by its address and
//! User-Agent. At most `MAX_SCRAPERS` are remembered; the one that pulled least recently is
//! forgotten first (its next pull is a first pull again).

use std::{collections::HashMap, sync::Mutex};

/// Scrapers remembered at most.
pub const MAX_SCRAPERS: usize = 64;

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
    /// Per scraper: the latest read its previous pull held, and when it pulled (a sequence
    /// number: the least recent is forgotten first).
    last: HashMap<String, (u64, u64)>,
    pulls: u64,
}

impl Pulls {
    /// The span scraper `who` gets now, asking for `seconds`: the reads since its previous
    /// pull where the window (its reads taken after `window_from_ns`) still holds them all,
    /// else those of the trailing `seconds` before `now_ns`. Remembers that this pull held
    /// the reads up to `latest_ns`.
    pub fn next(
        &self,
        who: &str,
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
        let who: String = who.chars().take(MAX_NAME).collect();
        let span = match state.last.get(&who) {
            Some(&(through, _)) if through >= window_from_ns => Span {
                after_ns: through,
                continued: true,
            },
            _ => Span {
                after_ns: now_ns.saturating_sub(u64::from(seconds) * 1_000_000_000),
                continued: false,
            },
        };
        if !state.last.contains_key(&who) && state.last.len() >= MAX_SCRAPERS {
            let oldest = state
                .last
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                state.last.remove(&k);
            }
        }
        // A pull held no read after the latest: the next one starts there.
        let through = latest_ns.max(span.after_ns);
        state.last.insert(who, (through, seq));
        span
    }
}

/// The name a pull's scraper goes by: its `scraper` query value, else its address and
/// User-Agent.
#[must_use]
pub fn scraper_name(query: Option<&str>, peer: Option<std::net::IpAddr>, agent: &str) -> String {
    let named = query.unwrap_or("").split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (super::decode(key) == "scraper").then(|| super::decode(value))
    });
    match named {
        Some(name) => format!("scraper={name}"),
        None => format!(
            "{} {agent}",
            peer.map_or_else(|| "?".to_owned(), |ip| ip.to_string())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_scraper_continues_from_its_previous_pull() {
        let pulls = Pulls::default();
        // Parca's pull: seconds = interval - 1 (9 of every 10 s).
        let first = pulls.next("parca", 9, 100 * S, 0, 100 * S);
        assert_eq!(
            first,
            Span {
                after_ns: 91 * S,
                continued: false
            }
        );
        let second = pulls.next("parca", 9, 110 * S, 0, 110 * S);
        assert_eq!(
            second,
            Span {
                after_ns: 100 * S,
                continued: true
            }
        );
        // Another scraper keeps its own place.
        assert_eq!(
            pulls.next("alloy", 14, 112 * S, 0, 112 * S).after_ns,
            98 * S
        );
        assert_eq!(
            pulls.next("parca", 9, 120 * S, 0, 119 * S).after_ns,
            110 * S
        );
        // Past the window's reach: a first pull again.
        let late = pulls.next("parca", 9, 500 * S, 200 * S, 500 * S);
        assert_eq!(
            late,
            Span {
                after_ns: 491 * S,
                continued: false
            }
        );
    }

    #[test]
    fn scrapers_are_bounded_the_least_recent_forgotten() {
        let pulls = Pulls::default();
        for i in 0..MAX_SCRAPERS {
            pulls.next(&i.to_string(), 10, 100 * S, 0, 100 * S);
        }
        // 0 pulls again: 1 is now the least recent, forgotten for the newcomer.
        assert!(pulls.next("0", 10, 101 * S, 0, 101 * S).continued);
        pulls.next("new", 10, 102 * S, 0, 102 * S);
        assert_eq!(pulls.state.lock().unwrap().last.len(), MAX_SCRAPERS);
        assert!(!pulls.next("1", 10, 103 * S, 0, 103 * S).continued);
        assert!(pulls.next("0", 10, 104 * S, 0, 104 * S).continued);
        let long = "x".repeat(10_000);
        pulls.next(&long, 10, 105 * S, 0, 105 * S);
        assert!(
            pulls
                .state
                .lock()
                .unwrap()
                .last
                .keys()
                .all(|k| k.len() <= MAX_NAME)
        );
    }

    #[test]
    fn scrapers_are_named_by_query_or_by_address_and_agent() {
        let ip = Some("10.0.0.7".parse().unwrap());
        assert_eq!(
            scraper_name(Some("seconds=9&scraper=parca%2D1"), ip, "Go"),
            "scraper=parca-1"
        );
        assert_eq!(
            scraper_name(Some("seconds=9"), ip, "Alloy/v1.5"),
            "10.0.0.7 Alloy/v1.5"
        );
        assert_eq!(scraper_name(None, None, ""), "? ");
    }
}
