//! /metrics rendered once per read: the exposition of a read's tables is the same for every
//! scrape until the next read, so the first scrape of each flavor renders it and the others
//! send it again, not copied (an answer is two pieces: the read's shared body and the
//! scrape's own tail). Only latprof's own process metrics, read at the scrape, are rendered
//! each time.
use std::{
    convert::Infallible,
    pin::Pin,
    sync::OnceLock,
    task::{Context, Poll},
};

use axum::body::Bytes;
use http_body::{Frame, SizeHint};

use crate::export::openmetrics::{self, Flavor, Live, Process};

/// The rendered tables of one read, per flavor (OpenMetrics, Prometheus text).
#[derive(Debug, Default)]
pub struct Rendered([OnceLock<Bytes>; 2]);

impl Rendered {
    /// /metrics for `live` (the read these belong to) and `process`, in `flavor`.
    #[must_use]
    pub fn metrics(&self, live: &Live, process: Option<&Process>, flavor: Flavor) -> Answer {
        let slot = match flavor {
            Flavor::OpenMetrics => &self.0[0],
            Flavor::Prometheus => &self.0[1],
        };
        let body = slot.get_or_init(|| Bytes::from(openmetrics::render_live_body(live, flavor)));
        let tail = openmetrics::render_live_tail(process, flavor);
        Answer([Some(body.clone()), Some(Bytes::from(tail))])
    }
}

/// An answer sent in its pieces as they are: a read's rendered tables (shared by every scrape
/// of the read: 1.7 MB for 500 series, which a copy per scrape cost) and a scrape's own tail.
#[derive(Debug)]
pub struct Answer([Option<Bytes>; 2]);

impl Answer {
    /// The whole answer as one text (tests, and whoever wants it so).
    #[must_use]
    pub fn text(&self) -> String {
        self.0
            .iter()
            .flatten()
            .map(|piece| String::from_utf8_lossy(piece))
            .collect()
    }
}

impl http_body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(
            self.0
                .iter_mut()
                .find_map(Option::take)
                .map(|piece| Ok(Frame::data(piece))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().flatten().map(|p| p.len() as u64).sum())
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
            assert_eq!(rendered.metrics(&live, None, flavor).text(), fresh);
            assert_eq!(
                fresh.ends_with("# EOF\n"),
                flavor == Flavor::OpenMetrics,
                "{fresh}"
            );
        }
        // Rendered once: a changed `live` is not looked at again for this read.
        let other = Live::default();
        assert_eq!(
            rendered.metrics(&other, None, Flavor::Prometheus).text(),
            render_live(&live, None, Flavor::Prometheus)
        );
    }
}
