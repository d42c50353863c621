//! `ldm7 demo`: its flags, parsed into the test bed's [`DemoOptions`]; the demo itself is
//! [`ldm7_testbed::demo`].

use std::path::PathBuf;
use std::time::Duration;

use ldm7_testbed::demo::DemoOptions;

use crate::common::{duration_arg, speed_arg};
use crate::exit::CmdResult;

/// Arguments of `ldm7 demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Trace to replay [default: the one-hour NGRID trace in $LDM7_SHARED or ../shared].
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Replay speed: 60 = the trace's hour in a minute (0 = as fast as possible).
    #[arg(long, default_value = "60", value_parser = speed_arg)]
    pub speed: f64,
    /// Replay only the first part of the trace, e.g. 10min [default: all of it].
    #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
    pub span: Option<Duration>,
    /// The FMTP sending rate (the path rate).
    #[arg(long, default_value = "1 Gbit/s")]
    pub rate: ldm7_types::Rate,
    /// Subscribers (2 or more: one loses packets, one is killed and restarted).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=16))]
    pub subscribers: u32,
    /// Share of multicast datagrams the lossy subscriber drops.
    #[arg(long, default_value = "0.02", value_parser = loss_arg)]
    pub loss: f64,
    /// Capacity of each queue (products are checked as they arrive, so queues may evict).
    #[arg(long, default_value = "1G")]
    pub queue_size: ldm7_types::ByteSize,
    /// Keep the demo's directory (queues, configurations, logs) instead of removing it.
    #[arg(long)]
    pub keep: bool,
}

/// Runs the demo: a bad trace or shared directory exits 1, a failed run 2.
pub fn run(args: &DemoArgs) -> CmdResult {
    let options = DemoOptions {
        trace: args.trace.clone(),
        speed: args.speed,
        span: args.span,
        rate: args.rate,
        subscribers: args.subscribers,
        loss: args.loss,
        queue_size: args.queue_size,
        keep: args.keep,
    };
    Ok(ldm7_testbed::demo::run(&options)?)
}

fn loss_arg(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(loss) if (0.0..1.0).contains(&loss) => Ok(loss),
        _ => Err(format!("loss {text:?} is not valid: give a share in [0, 1), e.g. 0.02")),
    }
}
