//! Publisher traffic control (the design's vlanUtil): an HTB tree with a multicast class and a
//! retransmission class under one parent at the path rate, each with a BFIFO buffer, and filters
//! that classify FMTP traffic; plus the `tc -s` counters read back as numbers.
//!
//! ```text
//! 1:   htb root, default 1:20 (unclassified traffic counts against the path rate too)
//! └── 1:1   rate r ceil r                         (the path)
//!     ├── 1:10  rate r·(1−s) ceil r prio 0  bfifo B  (multicast UDP: protocol 17 [dport P] or 224/4)
//!     └── 1:20  rate r·s     ceil r prio 1  bfifo B  (retransmission TCP: protocol 6 [sport Q])
//! ```
//!
//! IPv6 traffic is classified by the same rules (filters of protocol `ipv6`, prio 3 and 4:
//! next header 17 [dport P] or ff00::/8, next header 6 [sport Q]).
//!
//! Each class may borrow up to the whole rate `r` (`ceil r`) from the parent, which is what the
//! design asks for ("rate r, ceil r, borrowing"). What the parent has left over goes to the
//! multicast class first (HTB `prio 0` against `prio 1`): repairs for one lossy receiver then take
//! only their assured share and what the multicast leaves, never the multicast's own rate. The assured `rate`s of the two children add up
//! to `r` rather than being `r` each: HTB lets a class that is under its own assured rate send
//! without asking its parent, so two children at `rate r` could together send 2r. `s` is
//! [`HtbPlan::retx_share`] (default [`DEFAULT_RETX_SHARE`]). The whole plan is pure ([`HtbPlan::commands`]) and
//! unit-tested; [`install`] only runs the commands.

use crate::command::{Cmd, CommandError};
use ldm7_types::units::{ByteSize, Rate};

/// Default share of the path rate assured to retransmissions: small, so that one lossy
/// receiver's repairs cannot take the multicast's rate during bursts (measured: with ½, one
/// subscriber at 20% loss raised the others' p99 latency by 44%; with 0.02, by under 0.5%; see
/// docs/benchmarks.md). Repairs still borrow whatever the multicast leaves.
pub const DEFAULT_RETX_SHARE: f64 = 0.02;

/// HTB class id of the path (parent) class.
pub const PATH_CLASS: &str = "1:1";
/// HTB class id of the multicast class.
pub const MULTICAST_CLASS: &str = "1:10";
/// HTB class id of the retransmission class.
pub const RETX_CLASS: &str = "1:20";

/// What to install on a publisher's feed interface.
#[derive(Debug, Clone, PartialEq)]
pub struct HtbPlan {
    /// The path rate `r`.
    pub rate: Rate,
    /// The BFIFO limit `B` of each class, in bytes.
    pub buffer: ByteSize,
    /// UDP destination port of the multicast data; `None` classifies all multicast UDP.
    pub multicast_port: Option<u16>,
    /// TCP source port of the retransmission server; `None` classifies all TCP.
    pub retx_port: Option<u16>,
    /// Share `s` of `r` assured to retransmissions (the rest to multicast); both may borrow to `r`.
    pub retx_share: f64,
}

impl HtbPlan {
    /// A plan for rate `rate` and buffer `buffer`, classifying all multicast UDP and all TCP.
    pub fn new(rate: Rate, buffer: ByteSize) -> HtbPlan {
        HtbPlan { rate, buffer, multicast_port: None, retx_port: None, retx_share: DEFAULT_RETX_SHARE }
    }

    /// The `tc` argument lists (without the leading `tc`) that install the plan on `dev`,
    /// after the root qdisc has been deleted.
    pub fn commands(&self, dev: &str) -> Vec<Vec<String>> {
        let rate = self.rate.bits_per_s();
        let (multicast_rate, retx_rate) = self.class_rates();
        let class = |parent: &str, id: &str, assured: u64, prio: Option<&str>| {
            self.class_args("add", dev, parent, id, assured, prio)
        };
        let limit = self.buffer.bytes().min(u32::MAX as u64).to_string();
        let (multicast_match, retx_match) = self.class_matches("ip", "224.0.0.0/4");
        // The same for IPv6 (no extension headers before UDP or TCP, as FMTP sends them).
        let (multicast_match6, retx_match6) = self.class_matches("ip6", "ff00::/8");
        let filter_of = |protocol: &str, prio: &str, matches: Vec<String>, flow: &str| -> Vec<String> {
            let mut args =
                strings(&["filter", "add", "dev", dev, "parent", "1:", "protocol", protocol, "prio", prio, "u32"]);
            args.extend(matches);
            args.extend(strings(&["flowid", flow]));
            args
        };
        let filter = |prio: &str, matches: Vec<String>, flow: &str| filter_of("ip", prio, matches, flow);
        vec![
            strings(&["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20"]),
            class("1:", PATH_CLASS, rate, None),
            class(PATH_CLASS, MULTICAST_CLASS, multicast_rate, Some("0")),
            class(PATH_CLASS, RETX_CLASS, retx_rate, Some("1")),
            strings(&[
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                MULTICAST_CLASS,
                "handle",
                "10:",
                "bfifo",
                "limit",
                &limit,
            ]),
            strings(&["qdisc", "add", "dev", dev, "parent", RETX_CLASS, "handle", "20:", "bfifo", "limit", &limit]),
            filter("1", multicast_match, MULTICAST_CLASS),
            filter("2", retx_match, RETX_CLASS),
            filter_of("ipv6", "3", multicast_match6, MULTICAST_CLASS),
            filter_of("ipv6", "4", retx_match6, RETX_CLASS),
        ]
    }

    /// The u32 matches (`family`: `ip` or `ip6`) of the multicast class — UDP to the multicast
    /// port, else to any address of `all_multicast` — and of the repair class (TCP from the
    /// repair port, else any TCP).
    fn class_matches(&self, family: &str, all_multicast: &str) -> (Vec<String>, Vec<String>) {
        let mut multicast = strings(&["match", family, "protocol", "17", "0xff"]);
        match self.multicast_port {
            Some(port) => multicast.extend(strings(&["match", family, "dport", &port.to_string(), "0xffff"])),
            None => multicast.extend(strings(&["match", family, "dst", all_multicast])),
        }
        let mut retx = strings(&["match", family, "protocol", "6", "0xff"]);
        if let Some(port) = self.retx_port {
            retx.extend(strings(&["match", family, "sport", &port.to_string(), "0xffff"]));
        }
        (multicast, retx)
    }

    /// The `tc` argument lists that move an installed tree to this plan's rate and share
    /// (`class change` of the path class and both children; queues and filters stay).
    pub fn rate_change_commands(&self, dev: &str) -> Vec<Vec<String>> {
        let (multicast_rate, retx_rate) = self.class_rates();
        vec![
            self.class_args("change", dev, "1:", PATH_CLASS, self.rate.bits_per_s(), None),
            self.class_args("change", dev, PATH_CLASS, MULTICAST_CLASS, multicast_rate, Some("0")),
            self.class_args("change", dev, PATH_CLASS, RETX_CLASS, retx_rate, Some("1")),
        ]
    }

    /// The assured rates of the multicast and the retransmission class, bit/s.
    fn class_rates(&self) -> (u64, u64) {
        let share = self.retx_share.clamp(0.01, 0.99);
        let retx_rate = self.rate.scaled(share).bits_per_s();
        (self.rate.bits_per_s().saturating_sub(retx_rate).max(1), retx_rate)
    }

    /// `class VERB` of one HTB class: assured `assured` bit/s, ceiling the path rate.
    fn class_args(
        &self,
        verb: &str,
        dev: &str,
        parent: &str,
        id: &str,
        assured: u64,
        prio: Option<&str>,
    ) -> Vec<String> {
        let rate = self.rate.bits_per_s();
        let burst = burst_bytes(self.rate);
        let quantum = quantum_bytes(self.rate);
        let mut args = strings(&[
            "class",
            verb,
            "dev",
            dev,
            "parent",
            parent,
            "classid",
            id,
            "htb",
            "rate",
            &format!("{assured}bit"),
            "ceil",
            &format!("{rate}bit"),
            "burst",
            &burst.to_string(),
            "cburst",
            &burst.to_string(),
            "quantum",
            &quantum.to_string(),
        ]);
        if let Some(prio) = prio {
            args.extend(strings(&["prio", prio]));
        }
        args
    }
}

/// The rates of an installed tree: the path class's and the retransmission class's assured
/// rate, from `tc class show` text; `None` when the path class is not there.
pub fn installed_rates(text: &str) -> Option<(Rate, Rate)> {
    let rate_of = |class: &str| {
        text.lines().find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() != Some(&"class") || words.get(2) != Some(&class) {
                return None;
            }
            let position = words.iter().position(|w| *w == "rate")?;
            words.get(position + 1)?.parse::<Rate>().ok()
        })
    };
    let path = rate_of(PATH_CLASS)?;
    Some((path, rate_of(RETX_CLASS).unwrap_or(path.scaled(DEFAULT_RETX_SHARE))))
}

/// Moves the HTB tree installed on `dev` (by [`install`]) to `rate`, keeping the share the
/// retransmission class had. Returns the rate the tree had before, or `None` (nothing
/// changed) when `dev` has no such tree.
pub fn change_rate(netns: Option<&str>, dev: &str, rate: Rate) -> Result<Option<Rate>, CommandError> {
    let text = Cmd::new("tc").netns(netns).args(["class", "show", "dev", dev]).run()?;
    let Some((before, retx)) = installed_rates(&text) else { return Ok(None) };
    let plan = HtbPlan {
        retx_share: retx.bits_per_s() as f64 / before.bits_per_s().max(1) as f64,
        ..HtbPlan::new(rate, ByteSize::from_bytes(0))
    };
    for args in plan.rate_change_commands(dev) {
        Cmd::new("tc").netns(netns).args(args).run()?;
    }
    Ok(Some(before))
}

/// Installs `plan` on `dev` in namespace `netns`, replacing whatever root qdisc it had.
pub fn install(netns: Option<&str>, dev: &str, plan: &HtbPlan) -> Result<(), CommandError> {
    remove(netns, dev)?;
    for args in plan.commands(dev) {
        Cmd::new("tc").netns(netns).args(args).run()?;
    }
    Ok(())
}

/// Removes the root qdisc of `dev` (back to the default); nothing installed is not an error.
pub fn remove(netns: Option<&str>, dev: &str) -> Result<(), CommandError> {
    match Cmd::new("tc").netns(netns).args(["qdisc", "del", "dev", dev, "root"]).run() {
        Ok(_) => Ok(()),
        Err(error)
            if error.stderr().contains("No such file")
                || error.stderr().contains("handle of zero")
                || error.stderr().contains("Invalid handle") =>
        {
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// Counters of one HTB class, from `tc -s class show`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClassCounters {
    /// The class id, e.g. `1:10`.
    pub class_id: String,
    /// Bytes sent.
    pub sent_bytes: u64,
    /// Packets sent.
    pub sent_packets: u64,
    /// Packets dropped (buffer full).
    pub dropped_packets: u64,
    /// Times the class was over its limit and had to wait or borrow.
    pub overlimits: u64,
    /// Bytes queued now.
    pub backlog_bytes: u64,
    /// Packets queued now.
    pub backlog_packets: u64,
}

/// The counters of a publisher's HTB tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TcCounters {
    /// Every class found, in `tc` order.
    pub classes: Vec<ClassCounters>,
}

impl TcCounters {
    /// The class with id `class_id`.
    pub fn class(&self, class_id: &str) -> Option<&ClassCounters> {
        self.classes.iter().find(|c| c.class_id == class_id)
    }

    /// The path (parent) class: everything sent on the feed interface.
    pub fn path(&self) -> Option<&ClassCounters> {
        self.class(PATH_CLASS)
    }

    /// The multicast class.
    pub fn multicast(&self) -> Option<&ClassCounters> {
        self.class(MULTICAST_CLASS)
    }

    /// The retransmission class.
    pub fn retransmission(&self) -> Option<&ClassCounters> {
        self.class(RETX_CLASS)
    }

    /// Parses the text of `tc -s class show dev DEV` (iproute2 prints HTB classes as text even
    /// with `-j`).
    pub fn parse(text: &str) -> TcCounters {
        let mut classes = Vec::new();
        let mut current: Option<ClassCounters> = None;
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.first() {
                Some(&"class") => {
                    classes.extend(current.take());
                    current =
                        Some(ClassCounters { class_id: words.get(2).unwrap_or(&"").to_string(), ..Default::default() });
                }
                Some(&"Sent") => {
                    if let Some(class) = current.as_mut() {
                        class.sent_bytes = number_after(&words, "Sent");
                        class.sent_packets = number_after(&words, "bytes");
                        class.dropped_packets = number_after(&words, "(dropped");
                        class.overlimits = number_after(&words, "overlimits");
                    }
                }
                Some(&"backlog") => {
                    if let Some(class) = current.as_mut() {
                        class.backlog_bytes = words.get(1).map_or(0, |w| parse_tc_size(w));
                        class.backlog_packets =
                            words.get(2).and_then(|w| w.trim_end_matches('p').parse().ok()).unwrap_or(0);
                    }
                }
                _ => {}
            }
        }
        classes.extend(current);
        TcCounters { classes }
    }
}

/// Reads the class counters of `dev` in namespace `netns`.
pub fn read_counters(netns: Option<&str>, dev: &str) -> Result<TcCounters, CommandError> {
    let text = Cmd::new("tc").netns(netns).args(["-s", "class", "show", "dev", dev]).run()?;
    Ok(TcCounters::parse(&text))
}

/// HTB burst: one millisecond at the rate, at least two full frames, so that timer slack on a
/// busy machine does not cost throughput.
fn burst_bytes(rate: Rate) -> u64 {
    (rate.bytes_per_s() / 1000).max(2 * 1514)
}

/// HTB quantum: rate/10 bytes (HTB's r2q default) kept within the range HTB accepts silently.
fn quantum_bytes(rate: Rate) -> u64 {
    (rate.bytes_per_s() / 10).clamp(1514, 200_000)
}

fn number_after(words: &[&str], key: &str) -> u64 {
    words
        .iter()
        .position(|w| *w == key)
        .and_then(|i| words.get(i + 1))
        .and_then(|w| w.trim_end_matches([',', ')']).parse().ok())
        .unwrap_or(0)
}

/// Parses tc's printed sizes: `1514b`, `44Kb`, `3Mb` (binary multiples).
fn parse_tc_size(word: &str) -> u64 {
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let value: u64 = digits.parse().unwrap_or(0);
    match &word[digits.len()..] {
        "Kb" => value * 1024,
        "Mb" => value * 1024 * 1024,
        "Gb" => value * 1024 * 1024 * 1024,
        _ => value,
    }
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_two_borrowing_classes_under_the_path_rate() {
        let plan = HtbPlan {
            multicast_port: Some(38800),
            retx_port: Some(38801),
            ..HtbPlan::new(Rate::from_megabits_per_s(40), ByteSize::from_bytes(600_000_000))
        };
        let lines: Vec<String> = plan.commands("ngrid").iter().map(|a| a.join(" ")).collect();
        assert_eq!(lines[0], "qdisc add dev ngrid root handle 1: htb default 20");
        assert!(
            lines[1].starts_with("class add dev ngrid parent 1: classid 1:1 htb rate 40000000bit ceil 40000000bit")
        );
        assert!(
            lines[2].starts_with("class add dev ngrid parent 1:1 classid 1:10 htb rate 39200000bit ceil 40000000bit")
                && lines[2].ends_with("prio 0")
        );
        assert!(
            lines[3].starts_with("class add dev ngrid parent 1:1 classid 1:20 htb rate 800000bit ceil 40000000bit")
                && lines[3].ends_with("prio 1")
        );
        assert_eq!(lines[4], "qdisc add dev ngrid parent 1:10 handle 10: bfifo limit 600000000");
        assert_eq!(lines[5], "qdisc add dev ngrid parent 1:20 handle 20: bfifo limit 600000000");
        assert_eq!(
            lines[6],
            "filter add dev ngrid parent 1: protocol ip prio 1 u32 match ip protocol 17 0xff match ip dport 38800 0xffff flowid 1:10"
        );
        assert_eq!(
            lines[7],
            "filter add dev ngrid parent 1: protocol ip prio 2 u32 match ip protocol 6 0xff match ip sport 38801 0xffff flowid 1:20"
        );
        assert_eq!(
            lines[8],
            "filter add dev ngrid parent 1: protocol ipv6 prio 3 u32 match ip6 protocol 17 0xff match ip6 dport 38800 0xffff flowid 1:10"
        );
        assert_eq!(
            lines[9],
            "filter add dev ngrid parent 1: protocol ipv6 prio 4 u32 match ip6 protocol 6 0xff match ip6 sport 38801 0xffff flowid 1:20"
        );
    }

    #[test]
    fn without_ports_all_multicast_udp_and_all_tcp_are_classified() {
        let plan = HtbPlan::new(Rate::from_megabits_per_s(500), ByteSize::from_bytes(20_000_000));
        let lines: Vec<String> = plan.commands("f").iter().map(|a| a.join(" ")).collect();
        assert!(lines[6].contains("match ip protocol 17 0xff match ip dst 224.0.0.0/4 flowid 1:10"), "{}", lines[6]);
        assert!(lines[7].ends_with("match ip protocol 6 0xff flowid 1:20"), "{}", lines[7]);
        assert!(lines[8].contains("match ip6 protocol 17 0xff match ip6 dst ff00::/8 flowid 1:10"), "{}", lines[8]);
        assert!(lines[9].ends_with("match ip6 protocol 6 0xff flowid 1:20"), "{}", lines[9]);
        assert!(lines[1].contains("burst 62500 cburst 62500 quantum 200000"), "{}", lines[1]);
    }

    #[test]
    fn a_rate_change_changes_the_three_classes_in_place() {
        let plan = HtbPlan::new(Rate::from_megabits_per_s(50), ByteSize::from_bytes(0));
        let lines: Vec<String> = plan.rate_change_commands("ngrid").iter().map(|a| a.join(" ")).collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("class change dev ngrid parent 1: classid 1:1 htb rate 50000000bit ceil 50000000bit")
        );
        assert!(
            lines[1]
                .starts_with("class change dev ngrid parent 1:1 classid 1:10 htb rate 49000000bit ceil 50000000bit")
        );
        assert!(
            lines[2].starts_with("class change dev ngrid parent 1:1 classid 1:20 htb rate 1000000bit ceil 50000000bit")
        );
        // The same class arguments as the installing commands.
        let installing = plan.commands("ngrid");
        assert_eq!(installing[1][2..], plan.rate_change_commands("ngrid")[0][2..]);
    }

    #[test]
    fn installed_rates_parse_from_tc_text() {
        let text = "class htb 1:10 parent 1:1 leaf 10: prio 0 rate 49Mbit ceil 50Mbit burst 6250b cburst 6250b \n\
class htb 1:1 root rate 50Mbit ceil 50Mbit burst 6250b cburst 6250b \n\
class htb 1:20 parent 1:1 leaf 20: prio 1 rate 1Mbit ceil 50Mbit burst 6250b cburst 6250b \n";
        assert_eq!(installed_rates(text), Some((Rate::from_megabits_per_s(50), Rate::from_megabits_per_s(1))));
        assert_eq!(installed_rates("class htb 1:5 root rate 1Mbit ceil 1Mbit\n"), None);
        assert_eq!(installed_rates(""), None);
    }

    #[test]
    fn counters_parse_from_tc_text() {
        let text = "class htb 1:10 parent 1:1 leaf 10: prio 0 rate 10Mbit ceil 20Mbit burst 1600b cburst 1600b \n \
Sent 123456 bytes 89 pkt (dropped 7, overlimits 42 requeues 0) \n \
backlog 44Kb 30p requeues 0\n \
lended: 0 borrowed: 0 giants: 0\n\n\
class htb 1:1 root rate 20Mbit ceil 20Mbit burst 1600b cburst 1600b \n \
Sent 999 bytes 3 pkt (dropped 0, overlimits 0 requeues 0) \n \
backlog 0b 0p requeues 0\n";
        let counters = TcCounters::parse(text);
        assert_eq!(counters.classes.len(), 2);
        let multicast = counters.multicast().unwrap();
        assert_eq!(
            *multicast,
            ClassCounters {
                class_id: "1:10".into(),
                sent_bytes: 123456,
                sent_packets: 89,
                dropped_packets: 7,
                overlimits: 42,
                backlog_bytes: 44 * 1024,
                backlog_packets: 30,
            }
        );
        assert_eq!(counters.path().unwrap().sent_bytes, 999);
        assert!(counters.retransmission().is_none());
    }
}
