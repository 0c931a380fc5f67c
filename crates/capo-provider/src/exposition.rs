//! The process's metrics in Prometheus' text format, as `/metrics` serves them.
//!
//! Gathering builds every sample as a protobuf message (a `Metric` and a `LabelPair` with two
//! owned strings per label) before the text is written: about 900 bytes a sample, 10 MiB
//! for the engine's 12,000 per-LB series at 1,000 clusters, on every scrape. Collectors whose
//! series grow with the clusters write their text straight into the scrape instead
//! ([`write_direct`]), and gather nothing while they do; outside a scrape (a test's
//! `Registry::gather`, the demo's readings) they gather as any collector does.

use std::cell::RefCell;

use prometheus::{Encoder, Registry, TextEncoder};

thread_local! {
    /// The text of the scrape being gathered on this thread, if one is.
    static SCRAPE: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// `registry` as text: what collectors write directly (see [`write_direct`]), then every
/// other family as prometheus' encoder writes it.
pub fn text(registry: &Registry) -> prometheus::Result<Vec<u8>> {
    let (families, mut body) = {
        let scrape = Scrape::begin();
        // `Registry::gather` calls each collector on this thread, before it returns.
        let families = registry.gather();
        (families, scrape.finish())
    };
    TextEncoder::new().encode(&families, &mut body)?;
    Ok(body)
}

/// Inside [`text`], hands `write` the scrape's text and returns true; elsewhere returns false
/// and writes nothing, and the collector gathers its families as usual.
pub fn write_direct(write: impl FnOnce(&mut Vec<u8>)) -> bool {
    SCRAPE.with(|scrape| match scrape.borrow_mut().as_mut() {
        Some(body) => {
            write(body);
            true
        }
        None => false,
    })
}

/// A scrape's text on this thread; dropped (a panic in a collector) it leaves none behind, so
/// that a later plain gather is not written into a stale scrape.
struct Scrape;

impl Scrape {
    fn begin() -> Self {
        SCRAPE.with(|scrape| *scrape.borrow_mut() = Some(Vec::new()));
        Scrape
    }

    fn finish(self) -> Vec<u8> {
        SCRAPE.with(|scrape| scrape.borrow_mut().take().unwrap_or_default())
    }
}

impl Drop for Scrape {
    fn drop(&mut self) {
        SCRAPE.with(|scrape| scrape.borrow_mut().take());
    }
}

#[cfg(test)]
mod tests {
    use prometheus::core::{Collector, Desc};
    use prometheus::proto::MetricFamily;
    use prometheus::{IntCounter, Opts};

    use super::*;

    /// Writes one sample directly when it can; gathers it otherwise.
    struct Direct(IntCounter);

    impl Collector for Direct {
        fn desc(&self) -> Vec<&Desc> {
            self.0.desc()
        }

        fn collect(&self) -> Vec<MetricFamily> {
            if write_direct(|body| body.extend_from_slice(b"direct_total 7\n")) {
                return Vec::new();
            }
            self.0.collect()
        }
    }

    fn registry() -> Registry {
        let registry = Registry::new();
        let direct = IntCounter::with_opts(Opts::new("direct_total", "written directly"))
            .expect("valid name");
        direct.inc_by(7);
        registry
            .register(Box::new(Direct(direct)))
            .expect("registers");
        let gathered = IntCounter::new("gathered_total", "gathered").expect("valid name");
        gathered.inc();
        registry.register(Box::new(gathered)).expect("registers");
        registry
    }

    #[test]
    fn a_scrape_holds_the_direct_text_and_every_gathered_family() {
        let body = String::from_utf8(text(&registry()).expect("encodes")).expect("UTF-8");
        assert_eq!(
            body,
            "direct_total 7\n# HELP gathered_total gathered\n# TYPE gathered_total counter\ngathered_total 1\n"
        );
    }

    #[test]
    fn outside_a_scrape_a_direct_collector_gathers_as_usual() {
        let registry = registry();
        text(&registry).expect("encodes");
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert_eq!(names, ["direct_total", "gathered_total"]);
    }
}
