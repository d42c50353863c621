//! `ldm7 act` running as a user runs it: a real queue, the real binary, real files, decoders
//! and programs. Each action with each option (byte-exact), `^_ELSE_$` and continuation lines,
//! a restart in the middle of a stream, a decoder that dies, a reload, 10,000 products through
//! 20 FILE entries, and (with `LDM_REF_BIN`) the same tree of files as the reference `pqact`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use ldm7_act::output::metadata_record;
use ldm7_pq::{Capacity, Queue};
use ldm7_testkit::{skip, wait_until};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

use crate::support;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

struct Lab {
    dir: tempfile::TempDir,
    queue: Queue,
    count: u32,
}

impl Lab {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let queue = Queue::create(&dir.path().join("q.pq"), Capacity { bytes: 200 << 20, slots: 30_000 }, false)
            .expect("create the queue");
        Self { dir, queue, count: 0 }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn insert(&mut self, feed: &str, ident: &str, data: &[u8]) -> ProdInfo {
        self.count += 1;
        let mut signature = [0u8; 16];
        signature[..4].copy_from_slice(&self.count.to_be_bytes());
        let info = ProdInfo {
            arrival: "20261123180509".parse::<Timestamp>().expect("time"),
            signature: Signature(signature),
            origin: "act-test".into(),
            feedtype: feed.parse::<FeedType>().expect("feed"),
            seqno: self.count,
            ident: ident.into(),
            size: data.len() as u32,
        };
        self.queue.insert(&info, data).expect("insert");
        info
    }

    fn conf(&self, text: &str) -> PathBuf {
        let path = self.path("pqact.conf");
        std::fs::write(&path, text).expect("write the configuration");
        path
    }

    /// `ldm7 act` over the whole queue, to its end, in the lab's `out/` directory.
    fn act_once(&self, extra: &[&str]) -> Output {
        let out = self.path("out");
        std::fs::create_dir_all(&out).expect("out");
        Command::new(LDM7)
            .args(["act", "-v", "-i", "0", "-o", "3650d", "-q"])
            .arg(self.path("q.pq"))
            .arg("-d")
            .arg(&out)
            .args(extra)
            .arg(self.path("pqact.conf"))
            .output()
            .expect("run ldm7 act")
    }

    /// `ldm7 act` following the queue (from the state file), logging to `log`.
    fn act_follow(&self, log: &str) -> Child {
        let out = self.path("out");
        std::fs::create_dir_all(&out).expect("out");
        Command::new(LDM7)
            .args(["act", "-v", "-i", "1", "-l"])
            .arg(self.path(log))
            .arg("-q")
            .arg(self.path("q.pq"))
            .arg("-d")
            .arg(&out)
            .arg(self.path("pqact.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ldm7 act")
    }

    fn read(&self, name: &str) -> Vec<u8> {
        let path = self.path("out").join(name);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    fn read_text(&self, name: &str) -> String {
        String::from_utf8(self.read(name)).expect("text")
    }
}

fn ok(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "ldm7 act failed: {stderr}");
    stderr
}

/// Waits until `ldm7 act`'s log says `needle` at least `count` times (it follows the queue from
/// its "entries from" line on; a reload ends with "configuration reread" or "not changed").
fn wait_for_log(lab: &Lab, log: &str, needle: &str, count: usize) {
    wait_until(Duration::from_secs(20), needle, || {
        let text = std::fs::read_to_string(lab.path(log)).ok()?;
        (text.matches(needle).count() >= count).then_some(())
    });
}

fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).expect("signal");
}

fn stop(mut child: Child) {
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "ldm7 act ends with 0 on SIGTERM");
}

const WMO_PRODUCT: &[u8] = b"\x01\r\r\n042 \r\r\nSAUS43 KWBC 231800\r\r\nMTRXYZ\r\r\nbody\x02 text\r\r\n\x03\r\r\n";

#[test]
fn each_action_and_option_writes_what_the_reference_writes() {
    let mut lab = Lab::new();
    lab.conf(
        "# every action\n\
         ANY\t^t(.)\tFILE\tall/\\1.txt\n\
         ANY\t^t.\tFILE\t-overwrite\tlast.txt\n\
         ANY\t^t.\tFILE\t-strip\tstrip.txt\n\
         ANY\t^t.\tFILE\t-metadata\tmeta.bin\n\
         ANY\t^t.\tFILE\t-close -flush -log\tclosed.txt\n\
         ANY\t^t.\tSTDIOFILE\t-overwrite\tstdio-last.txt\n\
         ANY\t^t.\tSTDIOFILE\t-strip -log\tstdio.txt\n\
         ANY\t^t.\tSTDIOFILE\t-flush -close\tstdio-closed.txt\n\
         ANY\t^t.\tDBFILE\t-close -dblocksize 1024\tdb/closed.redb\n\
         ANY\t^t(.)\tEXEC\tsh -c \"echo \\1 >> exec-nowait-\\1.txt\"\n\
         ANY\t^t.\tPIPE\t-nodata\tsh -c \"cat >> nodata.bin\"\n\
         ANY\t^t.\tPIPE\t-metadata\n\
         \tsh -c \"cat >> piped-meta.bin\"\n\
         ANY\t^t(.)\tPIPE\t-strip -close\tsh -c \"cat > piped-strip-\\1.txt\"\n\
         ANY\t^t.\tPIPE\t-transient -flush\tsh -c \"cat >> piped.txt\"\n\
         ANY\t^t(.)\tEXEC\t-wait\tsh -c \"echo \\1 >> exec.txt\"\n\
         ANY\t^t(.)\tDBFILE\tdb/products.redb\tkey-\\1\n\
         ANY\t^t.\tDBFILE\tdb/products.redb\tall\n\
         ANY\t^SAUS\tFILE\t-removewmo\twmo.txt\n\
         ANY\t^SAUS\tPIPE\t-removewmo\tsh -c \"cat > piped-wmo.txt\"\n\
         ANY\t^SAUS\tSTDIOFILE\t-removewmo\tstdio-wmo.txt\n\
         ANY\t^noop\tNOOP\n\
         ANY\t^_ELSE_$\tFILE\telse.txt\n",
    );
    let first = lab.insert("IDS", "ta", b"one\x01\x7f\r\n");
    let second = lab.insert("HDS", "tb", b"two\n");
    lab.insert("WMO", "SAUS43 KWBC 231800", WMO_PRODUCT);
    lab.insert("WMO", "noop", b"nothing\n");
    lab.insert("WMO", "other", b"else\n");
    lab.insert("WMO", "_hidden", b"never\n");
    let stderr = ok(&lab.act_once(&["--summary"]));

    assert_eq!(lab.read("all/a.txt"), b"one\x01\x7f\r\n");
    assert_eq!(lab.read("all/b.txt"), b"two\n");
    assert_eq!(lab.read("last.txt"), b"two\n");
    assert_eq!(lab.read("strip.txt"), b"one\ntwo\n");
    let meta =
        [metadata_record(&first, 7), b"one\x01\x7f\r\n".to_vec(), metadata_record(&second, 4), b"two\n".to_vec()]
            .concat();
    assert_eq!(lab.read("meta.bin"), meta);
    assert_eq!(lab.read("closed.txt"), b"one\x01\x7f\r\ntwo\n");
    assert!(stderr.contains("Filed in \"closed.txt\":") && stderr.contains("StdioFiled in \"stdio.txt\":"), "{stderr}");
    assert_eq!(lab.read("stdio-last.txt"), b"two\n");
    assert_eq!(lab.read("stdio.txt"), b"one\ntwo\n");
    assert_eq!(lab.read("nodata.bin"), [metadata_record(&first, 7), metadata_record(&second, 4)].concat());
    assert_eq!(lab.read("piped-meta.bin"), meta);
    // -close: a decoder per product.
    assert_eq!(lab.read("piped-strip-a.txt"), b"one\n");
    assert_eq!(lab.read("piped-strip-b.txt"), b"two\n");
    assert_eq!(lab.read("piped.txt"), b"one\x01\x7f\r\ntwo\n");
    assert_eq!(lab.read_text("exec.txt"), "a\nb\n");
    // Without -wait the programs run on their own.
    for (name, text) in [("exec-nowait-a.txt", "a\n"), ("exec-nowait-b.txt", "b\n")] {
        wait_until(Duration::from_secs(10), name, || {
            (std::fs::read_to_string(lab.path("out").join(name)).ok()? == text).then_some(())
        });
    }
    assert_eq!(lab.read("stdio-closed.txt"), b"one\x01\x7f\r\ntwo\n");
    let closed = lab.path("out/db/closed.redb");
    assert_eq!(ldm7_act::outputs::db_get(&closed, b"ta").expect("db").as_deref(), Some(&b"one\x01\x7f\r\n"[..]));
    assert_eq!(ldm7_act::outputs::db_get(&closed, b"tb").expect("db").as_deref(), Some(&b"two\n"[..]));
    let db = lab.path("out/db/products.redb");
    assert_eq!(ldm7_act::outputs::db_get(&db, b"key-a").expect("db").as_deref(), Some(&b"one\x01\x7f\r\n"[..]));
    // A key already present: the new product is appended (as the reference's gdbm store does).
    assert_eq!(ldm7_act::outputs::db_get(&db, b"all").expect("db").as_deref(), Some(&b"one\x01\x7f\r\ntwo\n"[..]));
    // The SBN header and trailer, the WMO heading and the AWIPS line go.
    assert_eq!(lab.read("wmo.txt"), b"body\x02 text\r\r\n");
    assert_eq!(lab.read("piped-wmo.txt"), b"body\x02 text\r\r\n");
    assert_eq!(lab.read("stdio-wmo.txt"), b"body\x02 text\r\r\n");
    // NOOP keeps ^_ELSE_$ away from "noop"; an identifier starting with _ never matches it.
    assert_eq!(lab.read("else.txt"), b"else\n");
    assert!(stderr.contains("6 products read, 5 matched"), "{stderr}");
    assert!(stderr.contains(" 0 failed"), "{stderr}");
}

#[test]
fn a_restart_in_the_middle_of_a_stream_repeats_nothing_and_loses_nothing() {
    let mut lab = Lab::new();
    lab.conf("ANY\t^n\tFILE\tstream.txt\nANY\t^n\tPIPE\tsh -c \"cat >> piped.txt\"\n");
    // The first run starts at new products (no state file yet).
    let act = lab.act_follow("act1.log");
    wait_for_log(&lab, "act1.log", "entries from", 1);
    let total = 600;
    for index in 0..=total / 4 {
        lab.insert("EXP", &format!("n{index}"), format!("{index}\n").as_bytes());
    }
    // Stopped while products are still coming in.
    stop(act);
    let inserted_so_far = lab.count;
    for index in inserted_so_far..total {
        lab.insert("EXP", &format!("n{index}"), format!("{index}\n").as_bytes());
    }
    let act = lab.act_follow("act2.log");
    wait_until(Duration::from_secs(30), "every product filed", || {
        let text = std::fs::read_to_string(lab.path("out/stream.txt")).ok()?;
        (text.lines().count() >= total as usize).then_some(())
    });
    stop(act);
    let expected: String = (0..total).map(|index| format!("{index}\n")).collect();
    assert_eq!(lab.read_text("stream.txt"), expected);
    assert_eq!(lab.read_text("piped.txt"), expected);
    let log = std::fs::read_to_string(lab.path("act2.log")).expect("log");
    assert!(log.contains("resuming after the product inserted at"), "{log}");
}

#[test]
fn a_decoder_that_dies_is_restarted_and_holds_up_nothing() {
    let mut lab = Lab::new();
    // Each decoder takes one line and exits with status 3.
    lab.conf(
        "ANY\t^d\tPIPE\tsh -c \"read line; echo $line >> decoded.txt; exit 3\"\n\
         ANY\t^d\tFILE\tfiled.txt\n",
    );
    let act = lab.act_follow("act.log");
    wait_for_log(&lab, "act.log", "entries from", 1);
    // Each product meets a decoder that died: the next goes in once the one before was decoded
    // and act logged its decoder's exit (a product written to a decoder that is about to exit
    // without reading would be lost in its pipe, with LDM's pqact too).
    for index in 0..20 {
        lab.insert("EXP", &format!("d{index}"), format!("{index}\n").as_bytes());
        wait_for_log(&lab, "act.log", "exited with status 3", index + 1);
    }
    let expected: String = (0..20).map(|index| format!("{index}\n")).collect();
    wait_until(Duration::from_secs(20), "every product decoded", || {
        (std::fs::read_to_string(lab.path("out/decoded.txt")).ok()? == expected).then_some(())
    });
    stop(act);
    assert_eq!(lab.read_text("filed.txt"), expected);
    let log = std::fs::read_to_string(lab.path("act.log")).expect("log");
    assert!(log.contains("exited with status 3"), "{log}");
}

#[test]
fn a_decoder_that_stops_reading_is_given_up_and_the_others_go_on() {
    let mut lab = Lab::new();
    lab.conf("ANY\t^s\tPIPE\tsleep 600\nANY\t^s\tFILE\tfiled.txt\n");
    for index in 0..40 {
        lab.insert("EXP", &format!("s{index}"), &vec![b'x'; 100_000]);
    }
    let started = std::time::Instant::now();
    let output = lab.act_once(&["-t", "1", "--summary"]);
    let stderr = ok(&output);
    assert_eq!(lab.read("filed.txt").len(), 40 * 100_000);
    assert!(stderr.contains("took no input for"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn sighup_rereads_the_configuration_and_a_bad_one_keeps_the_old() {
    let mut lab = Lab::new();
    lab.conf("ANY\t.*\tFILE\ta.txt\n");
    let act = lab.act_follow("act.log");
    wait_for_log(&lab, "act.log", "entries from", 1);
    lab.insert("EXP", "one", b"1\n");
    wait_until(Duration::from_secs(10), "a.txt", || std::fs::metadata(lab.path("out/a.txt")).ok());
    lab.conf("ANY\t.*\tFILE\tb.txt\n");
    signal(&act, nix::sys::signal::Signal::SIGHUP);
    wait_for_log(&lab, "act.log", "configuration reread", 1);
    lab.insert("EXP", "two", b"2\n");
    wait_until(Duration::from_secs(10), "b.txt", || std::fs::metadata(lab.path("out/b.txt")).ok());
    lab.conf("ANY\t.*\tFILE\tb.txt\n# broken:\nANY\t.*\tBOGUS\tc.txt\n");
    signal(&act, nix::sys::signal::Signal::SIGHUP);
    wait_for_log(&lab, "act.log", "configuration not changed", 1);
    lab.insert("EXP", "three", b"3\n");
    wait_until(Duration::from_secs(10), "b.txt has two", || {
        (std::fs::read_to_string(lab.path("out/b.txt")).ok()? == "2\n3\n").then_some(())
    });
    stop(act);
    assert_eq!(lab.read_text("a.txt"), "1\n");
    let log = std::fs::read_to_string(lab.path("act.log")).expect("log");
    assert!(log.contains("configuration not changed") && log.contains("pqact.conf:3:"), "{log}");
}

#[test]
fn ten_thousand_products_through_twenty_file_entries() {
    let mut lab = Lab::new();
    let conf: String =
        (0..20).map(|entry| format!("ANY\t^p-([0-9]+)-([0-9]+)$\tFILE\te{entry:02}/\\2.txt\n")).collect();
    lab.conf(&conf);
    let mut expected = vec![Vec::new(); 50];
    for index in 0..10_000u32 {
        let bucket = index % 50;
        let data = format!("product {index} {}\n", "x".repeat((index % 97) as usize));
        lab.insert("EXP", &format!("p-{index:05}-{bucket:02}"), data.as_bytes());
        expected[bucket as usize].extend_from_slice(data.as_bytes());
    }
    // Fewer open files than outputs: the least recently used are closed and reopened.
    let stderr = ok(&lab.act_once(&["--max-open", "64", "--summary"]));
    assert!(stderr.contains("10000 products read, 10000 matched, 200000 actions done, 0 failed"), "{stderr}");
    for entry in 0..20 {
        for (bucket, bytes) in expected.iter().enumerate() {
            assert!(lab.read(&format!("e{entry:02}/{bucket:02}.txt")) == *bytes, "e{entry:02}/{bucket:02}.txt");
        }
    }
}

#[test]
fn write_errors_are_logged_once_per_output_and_the_other_entries_go_on() {
    let mut lab = Lab::new();
    lab.conf(
        "ANY\t.*\tFILE\t/dev/full\n\
         ANY\t.*\tFILE\tblocker/x.txt\n\
         ANY\t.*\tFILE\tgood.txt\n",
    );
    std::fs::create_dir_all(lab.path("out")).expect("out");
    std::fs::write(lab.path("out/blocker"), b"a file, not a directory").expect("blocker");
    for index in 0..3 {
        lab.insert("EXP", &format!("p{index}"), format!("{index}\n").as_bytes());
    }
    let stderr = ok(&lab.act_once(&["--summary"]));
    assert_eq!(lab.read_text("good.txt"), "0\n1\n2\n");
    assert_eq!(stderr.matches("ERROR act: FILE /dev/full:").count(), 1, "{stderr}");
    assert_eq!(stderr.matches("ERROR act: FILE blocker/x.txt:").count(), 1, "{stderr}");
    assert!(stderr.contains("3 actions done, 6 failed"), "{stderr}");
}

#[test]
fn a_bad_configuration_is_refused_before_anything_runs() {
    let mut lab = Lab::new();
    lab.conf("ANY\t.*\tFILE\tgood.txt\nANY\t(unclosed\tFILE\tx\n");
    lab.insert("EXP", "p", b"p\n");
    let output = lab.act_once(&[]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("pqact.conf:2:"), "{stderr}");
    assert!(!lab.path("out/good.txt").exists());
}

/// `-edex` with `-e`: the file written is announced in the System V ring an EDEX ingest reads
/// (root: the ring's key is the identity of /etc/rc.d/rc.local, created for the test if absent
/// and removed after).
#[test]
fn edex_entries_announce_their_files_in_the_shared_ring() {
    if !ldm7_testkit::is_root() {
        skip("needs root (the EDEX ring is keyed by /etc/rc.d/rc.local); CI runs it as root");
        return;
    }
    let key_file = Path::new(ldm7_act::edex::KEY_FILE);
    let created = !key_file.exists();
    if created {
        std::fs::create_dir_all(key_file.parent().expect("parent")).expect("/etc/rc.d");
        std::fs::write(key_file, "#!/bin/sh\n").expect("rc.local");
    }
    let mut lab = Lab::new();
    lab.conf("ANY\t^(.*)\tFILE\t-edex\tedex/\\1.txt\n");
    let out = lab.path("out");
    std::fs::create_dir_all(&out).expect("out");
    let act = Command::new(LDM7)
        .args(["act", "-e", "-i", "1", "-l"])
        .arg(lab.path("act.log"))
        .arg("-q")
        .arg(lab.path("q.pq"))
        .arg("-d")
        .arg(&out)
        .arg(lab.path("pqact.conf"))
        .spawn()
        .expect("start ldm7 act");
    wait_for_log(&lab, "act.log", "entries from", 1);
    lab.insert("EXP", "first", b"1\n");
    lab.insert("EXP", "second", b"2\n");
    wait_until(Duration::from_secs(10), "both filed", || std::fs::metadata(lab.path("out/edex/second.txt")).ok());
    // The ring is written after the file: wait for its second slot, and for the semaphore that
    // names it (set after the slot is written: read in between, the slot was there and the
    // semaphore still 0).
    wait_until(Duration::from_secs(10), "the ring's second slot", || {
        ldm7_act::edex::read_slot(1).ok().filter(|slot| slot.0 == "edex/second.txt" && slot.2 == 1)
    });
    let slots = [ldm7_act::edex::read_slot(0), ldm7_act::edex::read_slot(1)];
    stop(act);
    if created {
        let _ = std::fs::remove_file(key_file);
        let _ = std::fs::remove_dir(key_file.parent().expect("parent"));
    }
    let [first, second] = slots.map(|slot| slot.expect("the ring"));
    assert_eq!((first.0.as_str(), first.1.as_str()), ("edex/first.txt", "first"));
    assert_eq!((second.0.as_str(), second.1.as_str(), second.2), ("edex/second.txt", "second", 1));
}

#[test]
fn pqact_is_the_classic_name() {
    let mut lab = Lab::new();
    lab.conf("ANY\t.*\tFILE\tx.txt\n");
    lab.insert("EXP", "x", b"x\n");
    let exe = lab.path("pqact");
    std::os::unix::fs::symlink(LDM7, &exe).expect("symlink");
    let out = lab.path("out");
    std::fs::create_dir_all(&out).expect("out");
    let output = Command::new(&exe)
        .args(["-i", "0", "-o", "3650d", "-q"])
        .arg(lab.path("q.pq"))
        .arg("-d")
        .arg(&out)
        .arg(lab.path("pqact.conf"))
        .output()
        .expect("pqact");
    ok(&output);
    assert_eq!(lab.read("x.txt"), b"x\n");
}

/// The reference `pqact` and `ldm7 act`, each on its own queue holding the same files
/// (inserted by `pqinsert` and `ldm7 insert`), with the same configuration, write the same
/// tree of files.
#[test]
fn the_same_tree_of_files_as_the_reference_pqact() {
    let Some(bin) = std::env::var_os("LDM_REF_BIN").map(PathBuf::from) else {
        skip("LDM_REF_BIN is not set (a Unidata LDM 6.15 build's bin/ with pqcreate, pqinsert and pqact)");
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).expect("files");
    let mut names = Vec::new();
    for index in 0..200 {
        let name = format!("SAUS{:02}_KWBC_{index:03}", index % 7);
        let mut data = WMO_PRODUCT.to_vec();
        data.extend_from_slice(format!("product {index}\x01\n").as_bytes());
        std::fs::write(files.join(&name), data).expect("write");
        names.push(name);
    }
    let conf = "EXP\t^SAUS(..)_KWBC_([0-9]+)\tFILE\tby-type/\\1/\\2.txt\n\
                EXP\t^SAUS(..)_KWBC\tFILE\tappend/\\1.txt\n\
                EXP\t^SAUS(..)_KWBC\tFILE\t-overwrite\tlast/\\1.txt\n\
                EXP\t^SAUS(..)_KWBC\tFILE\t-strip -close\tstrip/\\1.txt\n\
                EXP\t^SAUS(..)_KWBC\tFILE\t-removewmo\tnowmo/\\1.txt\n\
                EXP\t^SAUS(..)_KWBC\tSTDIOFILE\tstdio/\\1.txt\n\
                EXP\t^SAUS(0.)_KWBC_([0-9]+)\tPIPE\tsh -c \"cat >> piped-\\1.txt\"\n\
                EXP\t^SAUS(0.)_KWBC_([0-9]+)\tPIPE\t-close\tsh -c \"cat > piped-\\1-\\2.txt\"\n\
                EXP\t^SAUS00_KWBC_([0-9]+)\tEXEC\t-wait\tsh -c \"echo \\1 >> exec.txt\"\n\
                EXP\t^SAUS01\tNOOP\n\
                EXP\t^_ELSE_$\tFILE\telse.txt\n";
    let mut trees = Vec::new();
    for reference in [true, false] {
        let root = dir.path().join(if reference { "reference" } else { "ldm7" });
        let out = root.join("out");
        std::fs::create_dir_all(&out).expect("out");
        let queue = root.join("q.pq");
        let conf_path = root.join("pqact.conf");
        std::fs::write(&conf_path, conf).expect("conf");
        let (create, insert, act) = if reference {
            (
                Command::new(bin.join("pqcreate")).args(["-l", "-", "-c", "-s", "50000000", "-q"]).arg(&queue).output(),
                Command::new(bin.join("pqinsert"))
                    .args(["-l", "-", "-f", "EXP", "-q"])
                    .arg(&queue)
                    .args(&names)
                    .current_dir(&files)
                    .output(),
                Command::new(bin.join("pqact"))
                    .args(["-l", "-", "-i", "0", "-o", "3600", "-q"])
                    .arg(&queue)
                    .arg("-d")
                    .arg(&out)
                    .arg(&conf_path)
                    .output(),
            )
        } else {
            (
                Command::new(LDM7).args(["queue", "create", "--size", "50000000", "--path"]).arg(&queue).output(),
                Command::new(LDM7)
                    .args(["insert", "-f", "EXP", "-q"])
                    .arg(&queue)
                    .args(&names)
                    .current_dir(&files)
                    .output(),
                Command::new(LDM7)
                    .args(["act", "-i", "0", "-o", "3600", "-q"])
                    .arg(&queue)
                    .arg("-d")
                    .arg(&out)
                    .arg(&conf_path)
                    .output(),
            )
        };
        for (what, output) in [("create", create), ("insert", insert), ("act", act)] {
            let output = output.unwrap_or_else(|error| panic!("{what}: {error}"));
            assert!(output.status.success(), "{what}: {}", String::from_utf8_lossy(&output.stderr));
        }
        // The reference does not wait for its decoders at exit: they run on in its `-d`
        // directory until their input ends; the tree is read once none is left.
        wait_until(Duration::from_secs(20), "the decoders to exit", || processes_in(&out).is_empty().then_some(()));
        trees.push(tree(&out));
    }
    assert!(trees[1].len() > 30, "{} files", trees[1].len());
    let names = |tree: &[(String, Vec<u8>)]| tree.iter().map(|(name, _)| name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&trees[0]), names(&trees[1]));
    for ((name, reference), (_, ours)) in trees[0].iter().zip(&trees[1]) {
        assert!(
            reference == ours,
            "{name} differs: reference {} bytes, ldm7 {} bytes\n{}\n---\n{}",
            reference.len(),
            ours.len(),
            String::from_utf8_lossy(&reference[..reference.len().min(600)]),
            String::from_utf8_lossy(&ours[..ours.len().min(600)])
        );
    }
}

/// The processes whose working directory is `dir`.
fn processes_in(dir: &Path) -> Vec<u32> {
    let dir = dir.canonicalize().expect("canonical directory");
    let entries = std::fs::read_dir("/proc").expect("/proc");
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            (std::fs::read_link(entry.path().join("cwd")).ok()? == dir).then_some(pid)
        })
        .collect()
}

/// Every file under `root` (sorted relative names) with its bytes.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let name = path.strip_prefix(root).expect("under root").display().to_string();
                files.push((name, std::fs::read(&path).expect("read")));
            }
        }
    }
    files.sort();
    files
}

/// `EXEC "pqact …"` in ldmd.conf: the server runs `ldm7` as pqact on its own queue; SIGTERM to
/// the server reaches it, and it saves its position.
#[test]
fn an_ldmd_conf_exec_of_pqact_runs_the_actions() {
    let root = tempfile::tempdir().expect("temporary directory");
    let mut node = support::Node::new(root.path(), "s", "20M", "EXEC \"pqact -i 1 -d out pqact.conf\"\n");
    std::fs::write(node.dir.join("pqact.conf"), "ANY\t^exec-(.*)\tFILE\tfrom-exec/\\1.txt\n").expect("conf");
    std::fs::create_dir_all(node.dir.join("out")).expect("out");
    // Without a pqact on PATH the server runs its own executable under that name.
    node.start();
    // pqact follows the queue from its "entries from" line on (in the server's log).
    wait_until(Duration::from_secs(15), "pqact to start", || node.log().contains("entries from").then_some(()));
    let queue = Queue::open(Path::new(&node.queue_path())).expect("queue");
    let info = ProdInfo {
        arrival: Timestamp::from_system_time(std::time::SystemTime::now()),
        signature: Signature([9; 16]),
        origin: "act-test".into(),
        feedtype: "EXP".parse::<FeedType>().expect("feed"),
        seqno: 1,
        ident: "exec-one".into(),
        size: 4,
    };
    queue.insert(&info, b"one\n").expect("insert");
    let filed = node.dir.join("out/from-exec/one.txt");
    wait_until(Duration::from_secs(15), "pqact to file the product", || {
        std::fs::read(&filed).ok().filter(|bytes| bytes == b"one\n")
    });
    node.stop();
    wait_until(Duration::from_secs(10), "pqact to save its position", || {
        std::fs::read_to_string(node.dir.join("pqact.conf.state")).ok().filter(|text| text.contains("# signature 0909"))
    });
}

/// As LDM's pqact: with `-v` every product read is logged, matched or not; a date indicator
/// with a day of month above 31 is an ERROR line naming the string (the file is still written,
/// with the code's text, as pqact writes it).
#[test]
fn verbose_logs_every_product_read_and_a_bad_day_of_month_is_reported() {
    let mut lab = Lab::new();
    lab.conf("EXP\t^DAY(..)\n\tFILE\t-close\tdays/(\\1:yyyy)\n");
    lab.insert("EXP", "DAY35", b"thirty-five\n");
    lab.insert("EXP", "NOTHING.MATCHES", b"unmatched\n");
    let output = lab.act_once(&[]);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(log.contains("DAY35") && log.contains("NOTHING.MATCHES"), "every product read is logged: {log}");
    assert!(log.contains("ERROR act: bad day of month in ident: days/(35:yyyy)"), "{log}");
    assert_eq!(lab.read_text("days/yyyy"), "thirty-five\n");
}

/// An EXEC'd pqact of a server killed outright (SIGKILL: no stop reaches its children, each in
/// a process group of its own) ends by itself, so that the restarted server's pqact does not
/// act on the same products beside it.
#[test]
fn an_execd_pqact_ends_with_a_server_killed_outright() {
    let root = tempfile::tempdir().expect("tempdir");
    let conf = root.path().join("pqact.conf");
    std::fs::write(&conf, "ANY\t^x\tFILE\tout.txt\n").expect("pqact.conf");
    let child = format!("pqact -f ANY {}", conf.display());
    let mut server =
        support::Node::new(root.path(), "s", "10M", &format!("ALLOW ANY {}\nEXEC \"{child}\"\n", support::LOCAL));
    server.start();
    let running = || {
        std::fs::read_dir("/proc").expect("/proc").flatten().any(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " ").trim_end() == child)
        })
    };
    wait_until(Duration::from_secs(10), "the server's pqact to run", || running().then_some(()));
    server.kill9();
    wait_until(Duration::from_secs(10), "its pqact to end with it", || (!running()).then_some(()));
}
