//! /metrics rendered once per read: the exposition of a read's tables is the same for every
//! scrape until the next read, so the first scrape of each flavor renders it and the others
//! copy it. Only latprof's own process metrics, read at the scrape, are rendered each time.
use std::sync::OnceLock;

use crate::export::openmetrics::{self, Flavor, Live, Process};

/// The rendered tables of one read, per flavor (OpenMetrics, Prometheus text).
#[derive(Debug, Default)]
pub struct Rendered([OnceLock<String>; 2]);

impl Rendered {
    /// /metrics for `live` (the read these belong to) and `process`, in `flavor`.
    #[must_use]
    pub fn metrics(&self, live: &Live, process: Option<&Process>, flavor: Flavor) -> String {
        let slot = match flavor {
            Flavor::OpenMetrics => &self.0[0],
            Flavor::Prometheus => &self.0[1],
        };
        let body = slot.get_or_init(|| openmetrics::render_live_body(live, flavor));
        let tail = openmetrics::render_live_tail(process, flavor);
        let mut out = String::with_capacity(body.len() + tail.len());
        out.push_str(body);
        out.push_str(&tail);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::openmetrics::{Series, render_live};

    /// Each flavor is rendered once and answered the same as rendering it anew; the flavors
    /// are kept apart.
    #[test]
    fn a_read_is_rendered_once_per_flavor_and_answered_the_same() {
        let live = Live {
            series: vec![Series {
                reason: "Waiting for \"event\"".to_owned(),
                state: "S",
                count: 7,
                total_ns: 3_500_000,
                buckets: [1; latprof_common::HIST_BUCKETS],
            }],
            mode: "lazy",
            ..Live::default()
        };
        let rendered = Rendered::default();
        for flavor in [Flavor::OpenMetrics, Flavor::Prometheus, Flavor::OpenMetrics] {
            let fresh = render_live(&live, None, flavor);
            assert_eq!(rendered.metrics(&live, None, flavor), fresh);
            assert_eq!(
                fresh.ends_with("# EOF\n"),
                flavor == Flavor::OpenMetrics,
                "{fresh}"
            );
        }
        // Rendered once: a changed `live` is not looked at again for this read.
        let other = Live::default();
        assert_eq!(
            rendered.metrics(&other, None, Flavor::Prometheus),
            render_live(&live, None, Flavor::Prometheus)
        );
    }
}
