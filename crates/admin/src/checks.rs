//! `ldm7 admin check` and its parts (`checktime`, `checkinsertion`, `vetqueuesize`): each finding
//! says what is wrong and what to do; any problem makes the command exit non-zero.

use ldm7_pq::{Queue, QueueStats};
use ldm7_types::Timestamp;

use crate::Site;

/// One finding of a check.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The check: `running`, `time`, `insertion`, `queue size`.
    pub check: &'static str,
    /// Whether it is a problem (else information or a warning).
    pub problem: bool,
    /// What was found, and for a problem what to do.
    pub text: String,
}

impl Finding {
    fn ok(check: &'static str, text: String) -> Self {
        Self { check, problem: false, text }
    }

    fn problem(check: &'static str, text: String) -> Self {
        Self { check, problem: true, text }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = if self.problem { "PROBLEM" } else { "ok" };
        write!(formatter, "{mark:<8} {:<11} {}", self.check, self.text)
    }
}

impl Site {
    /// Every check of `ldm7 admin check`, in LDM's order.
    pub fn check(&self) -> Vec<Finding> {
        let mut findings = vec![self.check_running()];
        findings.push(self.check_time());
        let stats = Queue::open(&self.site.queue.path)
            .map_err(|error| error.to_string())
            .and_then(|queue| queue.stats().map_err(|error| error.to_string()));
        match stats {
            Ok(stats) => {
                findings.push(self.check_insertion(&stats, Timestamp::from_system_time(std::time::SystemTime::now())));
                findings.push(self.vet_queue_size(&stats));
            }
            Err(error) => findings.push(Finding::problem(
                "queue",
                format!("{error}: make it with `ldm7 admin mkqueue` (after `ldm7 admin delqueue` if it is damaged)"),
            )),
        }
        findings
    }

    /// Whether the server runs.
    pub fn check_running(&self) -> Finding {
        match self.running() {
            Some(pid) => Finding::ok("running", format!("the server runs (pid {pid})")),
            None => Finding::problem("running", "the server is not running: start it with `ldm7 admin start`".into()),
        }
    }

    /// The clock against the site's time servers (the first that answers).
    pub fn check_time(&self) -> Finding {
        let check = &self.site.check;
        if check.time_servers.is_empty() {
            return Finding::ok("time", "not checked (no [check] time_servers)".into());
        }
        let mut failures = Vec::new();
        for server in &check.time_servers {
            match crate::sntp::offset(server, crate::sntp::TIMEOUT) {
                Ok(offset) if offset.abs() <= check.time_limit.as_secs_f64() => {
                    return Finding::ok(
                        "time",
                        format!("the clock is {offset:+.3} s from {server} (limit {} s)", check.time_limit.as_secs()),
                    );
                }
                Ok(offset) => {
                    return Finding::problem(
                        "time",
                        format!(
                            "the clock is {offset:+.3} s from {server}, more than the {} s limit: products would look \
                             {} than they are; synchronize the clock (chrony or ntpd)",
                            check.time_limit.as_secs(),
                            if offset > 0.0 { "younger" } else { "older" }
                        ),
                    );
                }
                Err(error) => failures.push(error),
            }
        }
        Finding::problem(
            "time",
            format!(
                "no time server answered ({}): check the network, or name reachable servers in [check] time_servers \
                 ([] turns the check off)",
                failures.join("; ")
            ),
        )
    }

    /// The newest product's age against the insertion-check interval.
    pub fn check_insertion(&self, stats: &QueueStats, now: Timestamp) -> Finding {
        let interval = self.site.check.insertion_interval;
        match stats.newest_insertion {
            None => Finding::problem(
                "insertion",
                "the queue holds no product: check the REQUEST entries and their upstreams (`ldm7 admin log`)".into(),
            ),
            Some(newest) => {
                let age = now.saturating_duration_since(newest);
                if age <= interval {
                    Finding::ok("insertion", format!("the newest product was inserted {} s ago", age.as_secs()))
                } else {
                    Finding::problem(
                        "insertion",
                        format!(
                            "the newest product was inserted {} s ago, more than the {} s of [check] \
                             insertion_interval: check the REQUEST entries and their upstreams (`ldm7 admin log`)",
                            age.as_secs(),
                            interval.as_secs()
                        ),
                    )
                }
            }
        }
    }

    /// `vetqueuesize`: the queue's minimum residence time against the maximum latency. A queue
    /// whose products stay less than the maximum latency evicts some before a slow downstream
    /// or pqact gets them: the size that would hold them, and how to get there.
    pub fn vet_queue_size(&self, stats: &QueueStats) -> Finding {
        let max_latency = self.site.server.max_latency;
        let Some(mvrt) = stats.mvrt else {
            return Finding::ok(
                "queue size",
                "nothing evicted yet (the queue has never been full): its residence time is not known".into(),
            );
        };
        if mvrt.residence >= max_latency {
            return Finding::ok(
                "queue size",
                format!(
                    "products stay at least {} s, no less than the {} s maximum latency",
                    mvrt.residence.as_secs(),
                    max_latency.as_secs()
                ),
            );
        }
        let scale = max_latency.as_secs_f64() / mvrt.residence.as_secs_f64().max(1.0);
        let size = (stats.capacity.bytes as f64 * scale * 1.1).ceil() as u64;
        let slots = (stats.capacity.slots as f64 * scale * 1.1).ceil() as u64;
        Finding::problem(
            "queue size",
            format!(
                "products stay only {} s (minimum residence time), less than the {} s maximum latency: some are evicted \
                 before they are sent or acted on. Fix: set [queue] size = \"{}\" and slots = {} in {} (or lower \
                 [server] max_latency), then `ldm7 admin stop`, `ldm7 admin delqueue`, `ldm7 admin mkqueue`, \
                 `ldm7 admin start`",
                mvrt.residence.as_secs(),
                max_latency.as_secs(),
                ldm7_types::units::ByteSize::from_bytes(size),
                slots,
                self.settings_file.display()
            ),
        )
    }
}
