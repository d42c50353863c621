//! Benchmark: how exactly the namespace lab delivers what its spec asks for (root).
//!
//! ```text
//! cargo run --release -p ldm7-net --example lab_fidelity -- [--rates 20M,100M,500M]
//! ```
//!
//! Builds a two-host lab per measurement (named `l7f<pid><letter>`, taken down afterwards) and
//! prints, against the configured value: the UDP round-trip time over a VDE leg with 20 ms
//! one-way delay (median of 40 probes), the loss of 20,000 datagrams to a host with 5% receive
//! loss, and the rate at the receiver of full-speed multicast through the publisher's HTB at each
//! rate (wire bytes, as HTB counts them), against the same blast without HTB in the same run.
//! Results go in `docs/lab.md` ("Measured fidelity") and `docs/benchmarks.md`. The lab tests
//! check delay and loss with wide margins and HTB's classes without timing (the rate HTB holds is
//! measured only here).

use std::process::ExitCode;
use std::time::Duration;

use ldm7_net::lab::{self, LabSpec, probe};
use ldm7_net::tc::{self, HtbPlan};
use ldm7_net::{ByteSize, Rate};

fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let rates = match arguments.as_slice() {
        [] => Ok(vec![Rate::from_megabits_per_s(20), Rate::from_megabits_per_s(100), Rate::from_megabits_per_s(500)]),
        [flag, list] if flag == "--rates" => list.split(',').map(str::parse).collect::<Result<Vec<Rate>, _>>(),
        _ => {
            eprintln!("usage: lab_fidelity [--rates 20M,100M,500M]");
            return ExitCode::from(1);
        }
    };
    let rates = match rates {
        Ok(rates) => rates,
        Err(error) => {
            eprintln!("lab_fidelity: --rates: {error}");
            return ExitCode::from(1);
        }
    };
    match measure(&rates) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lab_fidelity: {error}");
            ExitCode::from(2)
        }
    }
}

fn measure(rates: &[Rate]) -> Result<(), Box<dyn std::error::Error>> {
    lab::require_root()?;
    println!("| quantity | configured | measured |");
    println!("|---|---|---|");

    let delayed = Lab::up('r', "rate = \"40M\"\ndelay = { sub = \"20ms\" }\n", 0.0)?;
    let mut rtts = probe::round_trips(&delayed.spec, "feed", "pub", "sub", 40007, 40, Duration::from_millis(10))?;
    rtts.sort();
    let median_ms = rtts.get(rtts.len() / 2).map_or(f64::NAN, |rtt| rtt.as_secs_f64() * 1e3);
    let min_ms = rtts.first().map_or(f64::NAN, |rtt| rtt.as_secs_f64() * 1e3);
    println!(
        "| RTT over VDE (UDP echo, median of {}) | 40 ms (20 ms one-way) | {median_ms:.2} ms (min {min_ms:.2}) |",
        rtts.len()
    );
    drop(delayed);

    let lossy = Lab::up('l', "rate = \"100M\"\nbuffer = \"10MB\"\n", 5.0)?;
    let loss = probe::udp_loss(&lossy.spec, "feed", "pub", "sub", 40008, 20_000)?;
    println!("| loss over {} datagrams | 5% | {:.2}% |", loss.sent, loss.loss_percent());
    drop(lossy);

    let shaped = Lab::up('h', "rate = \"20M\"\nbuffer = \"10MB\"\nmulticast_port = 38800\n", 0.0)?;
    // The baseline of the same run: the same blast with no HTB on the publisher's interface.
    let publisher = shaped.spec.netns_of("pub");
    tc::remove(Some(&publisher), "feed")?;
    let unshaped = blast(&shaped.spec)?;
    println!(
        "| full-speed multicast UDP without HTB, at the receiver (wire bytes; baseline) | none | {:.2} Mbit/s |",
        unshaped.wire_bits_per_s / 1e6
    );
    for &rate in rates {
        let plan = HtbPlan { multicast_port: Some(38800), ..HtbPlan::new(rate, ByteSize::from_bytes(10_000_000)) };
        tc::install(Some(&publisher), "feed", &plan)?;
        let sample = blast(&shaped.spec)?;
        let counters = tc::read_counters(Some(&publisher), "feed")?;
        let multicast = counters.multicast().cloned().unwrap_or_default();
        println!(
            "| full-speed multicast UDP through HTB, at the receiver (wire bytes) | {rate} | {:.2} Mbit/s ({:+.2}%; tc: {} sent, {} dropped, {} overlimits) |",
            sample.wire_bits_per_s / 1e6,
            100.0 * (sample.wire_bits_per_s / rate.bits_per_s() as f64 - 1.0),
            multicast.sent_packets,
            multicast.dropped_packets,
            multicast.overlimits
        );
    }
    Ok(())
}

/// Full-speed multicast from `pub` to `sub` for 2 s, measured over the last 1.5 s.
fn blast(spec: &LabSpec) -> Result<probe::BlastSample, probe::ProbeError> {
    probe::multicast_blast(spec, "feed", "pub", "sub", 38800, Duration::from_millis(500), Duration::from_millis(1500))
}

/// A two-host lab (`pub` → `sub` on feed `feed`), taken down when dropped.
struct Lab {
    spec: LabSpec,
}

impl Lab {
    fn up(letter: char, feed: &str, loss_percent: f64) -> Result<Lab, Box<dyn std::error::Error>> {
        let text = format!(
            "name = \"l7f{}{letter}\"\n[[hosts]]\nname = \"pub\"\n[[hosts]]\nname = \"sub\"\nloss_percent = {loss_percent:.1}\n\
             [[feeds]]\nname = \"feed\"\npublisher = \"pub\"\nsubscribers = [\"sub\"]\n{feed}",
            std::process::id() % 100_000
        );
        let spec = LabSpec::from_toml_str(&text)?;
        lab::down_spec(&spec)?;
        lab::up(&spec, &text)?;
        Ok(Lab { spec })
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(error) = lab::down_spec(&self.spec) {
            eprintln!("lab_fidelity: taking lab {} down failed: {error}", self.spec.name);
        }
    }
}
