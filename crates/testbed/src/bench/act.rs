//! `ldm7 bench act`: products per second through `ldm7 act`, as a user runs it (the command
//! started on a queue, run to the end of the queue with `-i 0`, start-up and shutdown
//! included), each case against a baseline in the same run: the same bytes written to the same
//! files (or the same decoder) by a plain loop that reads the queue, with the destinations
//! computed without patterns and every file kept open.
//!
//! Products: NEXRAD Level III sizes from the shared trace (cycled), with identifiers of the
//! feed's form (`SDUS5x KSSS DDHHMM /pPPPSSS`) so the back-references fan out as a site's
//! configuration does. Cases:
//! * `files`: 20 FILE entries, each with back-references and strftime
//!   (`e<k>/\6/\5_%Y%m%d%H.nids`: per entry, a file per product code and hour);
//! * `pipe`: one PIPE entry (`sh -c "cat > piped.out"`).
//!
//! With `LDM_REF_BIN` pointing at a reference build, Unidata LDM 6.15's `pqact` runs the same
//! configuration on its own queue holding the same products (inserted by its `pqinsert` from
//! the same files), timed until it has exited and its output is complete (it does not wait for
//! its decoders).
//!
//! Runs alternate (the order reverses every run), outputs are removed and the page cache
//! written back between runs; medians of `--repeat` runs are printed.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ldm7_pq::{Capacity, Queue};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

use super::reference::{System, settle};

const TRACE: &str = "data/traces/unidata_ldm_NEXRAD3_500prod_20150911T2259Z.txt";
const ENTRIES: usize = 20;
const PRODUCT_CODES: [&str; 5] = ["N0R", "N0V", "NCR", "NTP", "N1P"];
const STATIONS: [&str; 8] = ["MOB", "LIX", "TLH", "JAX", "BMX", "HTX", "FFC", "MXX"];

/// What `ldm7 bench act` measures.
#[derive(Debug, Clone)]
pub struct ActOptions {
    /// Directory for the queue and the outputs (`None`: the system temporary directory).
    pub dir: Option<PathBuf>,
    /// Products in the queue.
    pub products: usize,
    /// Runs per case and side; medians are reported.
    pub repeat: u32,
    /// Trace whose product sizes are used (`None`: the NEXRAD3 trace in the shared directory,
    /// [`crate::demo::find_shared`]).
    pub trace: Option<PathBuf>,
}

/// What is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Side {
    Act,
    Loop,
    Reference,
}

/// A product's identifier (also its file name, for `pqinsert`) and where the 20 FILE entries
/// put it.
struct Planned {
    ident: String,
    code: &'static str,
    station: &'static str,
}

/// Runs the benchmark and prints the results.
pub fn run(args: &ActOptions) -> anyhow::Result<()> {
    if args.products == 0 || args.repeat == 0 {
        bail!("--products and --repeat must be positive");
    }
    let trace = match &args.trace {
        Some(trace) => trace.clone(),
        None => crate::demo::find_shared(TRACE).map_err(|failure| anyhow::anyhow!("{failure}"))?,
    };
    let sizes: Vec<usize> = std::fs::read_to_string(&trace)
        .with_context(|| format!("read {}", trace.display()))?
        .lines()
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    if sizes.is_empty() {
        bail!("{}: no product sizes", trace.display());
    }
    let scratch = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .context("create a scratch directory")?;
    let reference = System::from_env()?.into_iter().find_map(|system| match system {
        System::Reference(bin) => Some(bin),
        System::Ldm7(_) => None,
    });
    let queue_path = scratch.path().join("q.pq");
    let files_dir = scratch.path().join("products");
    let arrival = Timestamp::from_system_time(std::time::SystemTime::now());
    let (planned, bytes) = fill_queue(&queue_path, &files_dir, args.products, &sizes, arrival)?;
    let reference_queue = scratch.path().join("ref.pq");
    if let Some(bin) = &reference {
        fill_reference_queue(bin, &reference_queue, &files_dir, &planned, bytes)?;
    }
    let hour = hour_text(arrival);
    println!(
        "ldm7 bench act: {} products, {:.1} MB (NEXRAD3 sizes from {}), {} runs per case{}",
        args.products,
        bytes as f64 / 1e6,
        trace.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
        args.repeat,
        if reference.is_some() { ", with LDM 6.15's pqact" } else { "" }
    );
    let exe = std::env::current_exe().context("find the ldm7 executable")?;
    let conf_files = scratch.path().join("files.conf");
    std::fs::write(&conf_files, files_conf()).context("write the configuration")?;
    let conf_pipe = scratch.path().join("pipe.conf");
    std::fs::write(&conf_pipe, "NEXRAD3\t^SDUS\tPIPE\tsh -c \"cat > piped.out\"\n")
        .context("write the configuration")?;
    let out = scratch.path().join("out");
    let mut sides = vec![Side::Act, Side::Loop];
    if reference.is_some() {
        sides.push(Side::Reference);
    }

    for case in ["files", "pipe"] {
        let conf = if case == "files" { &conf_files } else { &conf_pipe };
        let expected = if case == "files" { bytes * ENTRIES as u64 } else { bytes };
        let mut times: HashMap<Side, Vec<f64>> = HashMap::new();
        for run in 0..args.repeat {
            let mut order = sides.clone();
            if run % 2 == 1 {
                order.reverse();
            }
            for side in order {
                reset(&out)?;
                let started = Instant::now();
                match side {
                    Side::Act => run_act(&exe, &queue_path, &out, conf)?,
                    Side::Loop if case == "files" => loop_files(&queue_path, &out, &planned, &hour)?,
                    Side::Loop => loop_pipe(&queue_path, &out)?,
                    Side::Reference => {
                        let bin = reference.as_deref().expect("a reference build");
                        run_pqact(bin, &reference_queue, &out, conf, &scratch.path().join("pqact.log"))?;
                        // pqact does not wait for its decoders: the run ends when the output is whole.
                        let deadline = Instant::now() + Duration::from_secs(60);
                        while output_bytes(&out)? < expected && Instant::now() < deadline {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
                let elapsed = started.elapsed().as_secs_f64();
                let written = output_bytes(&out)?;
                if written != expected {
                    bail!("{case} ({side:?}): {written} bytes written, {expected} expected");
                }
                times.entry(side).or_default().push(elapsed);
            }
        }
        let label = if case == "files" { "20 FILE entries (back-references, strftime)" } else { "one PIPE" };
        println!("{label}: {:.1} MB written per run", expected as f64 / 1e6);
        let runs = |times: &[f64]| times.iter().map(|time| format!("{time:.3}")).collect::<Vec<_>>().join(", ");
        for side in &sides {
            let name = match side {
                Side::Act => "ldm7 act",
                Side::Loop => "plain loop",
                Side::Reference => "LDM pqact",
            };
            let median = crate::median(times[side].clone());
            println!(
                "  {name:<10}  median {median:.3} s = {:.0} products/s  (runs: {})",
                args.products as f64 / median,
                runs(&times[side])
            );
        }
        let ratio = |over: Side, under: Side| {
            crate::median(times[&over].iter().zip(&times[&under]).map(|(over, under)| over / under).collect())
        };
        println!("  ldm7 act / plain loop time: median {:.2}x", ratio(Side::Act, Side::Loop));
        if reference.is_some() {
            println!("  LDM pqact / ldm7 act time: median {:.2}x", ratio(Side::Reference, Side::Act));
        }
    }
    reset(&out)?;
    Ok(())
}

/// Writes the products as files (named by their identifiers) and inserts them into the queue.
fn fill_queue(
    path: &Path,
    files_dir: &Path,
    count: usize,
    sizes: &[usize],
    arrival: Timestamp,
) -> anyhow::Result<(Vec<Planned>, u64)> {
    let total: u64 = (0..count).map(|index| sizes[index % sizes.len()] as u64 + 512).sum();
    let queue = Queue::create(path, Capacity { bytes: total * 5 / 4 + (16 << 20), slots: count as u64 + 100 }, true)
        .context("create the queue")?;
    std::fs::create_dir_all(files_dir).context("create the product directory")?;
    let feed: FeedType = "NEXRAD3".parse().expect("a feed");
    let (mut planned, mut bytes) = (Vec::with_capacity(count), 0u64);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for index in 0..count {
        let size = sizes[index % sizes.len()];
        let code = PRODUCT_CODES[index % PRODUCT_CODES.len()];
        let station = STATIONS[(index / PRODUCT_CODES.len()) % STATIONS.len()];
        let ident = format!("SDUS5{}_K{station}_112259_p{code}{station}_{index:06}", index % 10);
        let mut data = vec![0u8; size];
        for chunk in data.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(files_dir.join(&ident), &data).context("write a product file")?;
        let info = ProdInfo {
            arrival,
            signature: Signature(<md5::Md5 as md5::Digest>::digest(&data).into()),
            origin: "bench".into(),
            feedtype: feed,
            seqno: 0,
            ident: ident.clone(),
            size: size as u32,
        };
        queue.insert(&info, &data).context("insert")?;
        bytes += size as u64;
        planned.push(Planned { ident, code, station });
    }
    Ok((planned, bytes))
}

/// The reference's queue with the same products, inserted by its `pqinsert`.
fn fill_reference_queue(
    bin: &Path,
    queue: &Path,
    files_dir: &Path,
    planned: &[Planned],
    bytes: u64,
) -> anyhow::Result<()> {
    let reference = System::Reference(bin.to_path_buf());
    reference.create_queue(queue, bytes * 5 / 4 + (16 << 20), planned.len() as u64 + 100)?;
    for chunk in planned.chunks(1000) {
        let names: Vec<String> = chunk.iter().map(|plan| plan.ident.clone()).collect();
        let output = Command::new(bin.join("pqinsert"))
            .args(["-l", "-", "-f", "NEXRAD3", "-q"])
            .arg(queue)
            .args(&names)
            .current_dir(files_dir)
            .stdin(Stdio::null())
            .output()
            .context("run pqinsert")?;
        if !output.status.success() {
            bail!("pqinsert failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
    }
    Ok(())
}

/// The 20 entries: the classic NIDS filing pattern (with `_` for the identifier's blanks and
/// `/`, so it can name a file for `pqinsert`), one directory tree per entry.
fn files_conf() -> String {
    (0..ENTRIES)
        .map(|entry| {
            format!(
                "NEXRAD3\t^SDUS5(.)_(K...)_([0-3][0-9])([0-2][0-9])([0-5][0-9])_p(...)(...)_\n\
                 \tFILE\te{entry:02}/\\6/\\7_%Y%m%d%H.nids\n"
            )
        })
        .collect()
}

/// `%Y%m%d%H` of the products' arrival (UTC), as the entries' strftime gives it.
fn hour_text(arrival: Timestamp) -> String {
    let (days, secs) = (arrival.secs.div_euclid(86_400), arrival.secs.rem_euclid(86_400));
    let (year, month, day) = ldm7_types::time::civil_from_days(days);
    format!("{year:04}{month:02}{day:02}{:02}", secs / 3600)
}

fn run_act(exe: &Path, queue: &Path, out: &Path, conf: &Path) -> anyhow::Result<()> {
    let mut command = Command::new(exe);
    command.args(["act", "-i", "0", "-o", "30d", "-q"]).arg(queue).arg("-d").arg(out).arg(conf);
    run_to_end(command, "ldm7 act")
}

fn run_pqact(bin: &Path, queue: &Path, out: &Path, conf: &Path, log: &Path) -> anyhow::Result<()> {
    let mut command = Command::new(bin.join("pqact"));
    command.args(["-i", "0", "-o", "2592000", "-l"]).arg(log).arg("-q").arg(queue).arg("-d").arg(out).arg(conf);
    run_to_end(command, "pqact")
}

fn run_to_end(mut command: Command, what: &str) -> anyhow::Result<()> {
    let output = command.stdin(Stdio::null()).output().with_context(|| format!("run {what}"))?;
    if !output.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// The baseline of `files`: every product appended to its 20 files, files kept open.
fn loop_files(queue: &Path, out: &Path, planned: &[Planned], hour: &str) -> anyhow::Result<()> {
    let queue = Queue::open(queue).context("open the queue")?;
    let mut follower = queue.follow(Timestamp::ZERO);
    let mut open: HashMap<PathBuf, File> = HashMap::new();
    let by_ident: HashMap<&str, &Planned> = planned.iter().map(|plan| (plan.ident.as_str(), plan)).collect();
    loop {
        let done = follower.next_with(Some(Duration::ZERO), |product| -> anyhow::Result<()> {
            let plan = by_ident.get(product.info.ident.as_str()).context("a product of the benchmark")?;
            for entry in 0..ENTRIES {
                let path = out.join(format!("e{entry:02}/{}/{}_{hour}.nids", plan.code, plan.station));
                let file = match open.entry(path) {
                    std::collections::hash_map::Entry::Occupied(file) => file.into_mut(),
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        std::fs::create_dir_all(slot.key().parent().expect("a parent"))?;
                        let file = OpenOptions::new().create(true).append(true).open(slot.key())?;
                        slot.insert(file)
                    }
                };
                file.write_all(product.data)?;
            }
            Ok(())
        })?;
        match done {
            Some(result) => result?,
            None => break,
        }
    }
    Ok(())
}

/// The baseline of `pipe`: every product written to one decoder's standard input.
fn loop_pipe(queue: &Path, out: &Path) -> anyhow::Result<()> {
    let queue = Queue::open(queue).context("open the queue")?;
    let mut child = Command::new("sh")
        .args(["-c", "cat > piped.out"])
        .current_dir(out)
        .stdin(Stdio::piped())
        .spawn()
        .context("start the decoder")?;
    let mut stdin = child.stdin.take().expect("piped");
    let mut follower = queue.follow(Timestamp::ZERO);
    while let Some(result) = follower.next_with(Some(Duration::ZERO), |product| stdin.write_all(product.data))? {
        result?;
    }
    drop(stdin);
    child.wait()?;
    Ok(())
}

fn reset(out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        std::fs::remove_dir_all(out).with_context(|| format!("remove {}", out.display()))?;
    }
    std::fs::create_dir_all(out)?;
    settle();
    Ok(())
}

/// The bytes of every file under `out`.
fn output_bytes(out: &Path) -> anyhow::Result<u64> {
    let mut total = 0u64;
    let mut pending = vec![out.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            } else {
                total += entry.metadata()?.len();
            }
        }
    }
    Ok(total)
}
