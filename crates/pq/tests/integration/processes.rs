//! The queue shared by real processes: concurrent inserters and readers, and inserters killed
//! with SIGKILL in the middle of inserting.
//!
//! Child processes are this test binary run again with `LDM7_PQ_CHILD` set: the `child` test
//! below then plays the requested role instead of doing nothing.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ldm7_pq::{Capacity, InsertOutcome, Queue};
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};

const CHILD_ROLE: &str = "LDM7_PQ_CHILD";
const CHILD_QUEUE: &str = "LDM7_PQ_CHILD_QUEUE";
const CHILD_ARG: &str = "LDM7_PQ_CHILD_ARG";

/// Deterministic product `index` of inserter `inserter`: sizes spread over 100 B – 60 kB,
/// signature = MD5 of the data (so a torn product would show).
fn make_product(inserter: u32, index: u32, size_scale: usize) -> (ProdInfo, Vec<u8>) {
    let size = (100 + (index as usize * 7919 + inserter as usize * 104_729) % 60_000) * size_scale;
    let mut data = vec![(index % 251) as u8; size];
    data[..4].copy_from_slice(&index.to_le_bytes());
    data[4..8].copy_from_slice(&inserter.to_le_bytes());
    let info = ProdInfo {
        arrival: Timestamp::from_unix_micros(1_434_326_400_000_000),
        signature: Signature::md5_of(&data),
        origin: format!("inserter{inserter}"),
        feedtype: FeedType::NGRID,
        seqno: index,
        ident: format!("test/{inserter}/{index}"),
        size: size as u32,
    };
    (info, data)
}

/// The entry point of every child process (a no-op in a normal test run).
#[test]
fn child() {
    let Ok(role) = std::env::var(CHILD_ROLE) else { return };
    let queue = Queue::open(Path::new(&std::env::var(CHILD_QUEUE).unwrap())).unwrap();
    let arg: u32 = std::env::var(CHILD_ARG).unwrap().parse().unwrap();
    let mut out = std::io::stdout().lock();
    match role.as_str() {
        // Insert products 0..PRODUCTS_PER_INSERTER as inserter `arg`.
        "inserter" => {
            for index in 0..PRODUCTS_PER_INSERTER {
                let (info, data) = make_product(arg, index, 1);
                assert!(matches!(queue.insert(&info, &data).unwrap(), InsertOutcome::Inserted { .. }));
            }
        }
        // Insert large products forever (until killed), announcing each insert as it begins
        // (the product is made before, so a kill upon the line lands in the insert) and the
        // end of the first.
        "endless-inserter" => {
            for index in arg.. {
                let (info, data) = make_product(99, index, 8);
                writeln!(out, "inserting {index}").unwrap();
                out.flush().unwrap();
                queue.insert(&info, &data).unwrap();
                if index == arg {
                    writeln!(out, "started").unwrap();
                    out.flush().unwrap();
                }
            }
        }
        // Follow from the beginning; print "<insertion µs> <signature>" per product until
        // `arg` products were seen.
        "reader" => {
            writeln!(out, "ready").unwrap();
            out.flush().unwrap();
            let mut follower = queue.follow(Timestamp::ZERO);
            for _ in 0..arg {
                let line = follower
                    .next_with(Some(Duration::from_secs(60)), |product| {
                        assert_eq!(Signature::md5_of(product.data), product.info.signature, "torn product");
                        format!("{} {}", product.insertion.as_unix_micros(), product.info.signature)
                    })
                    .unwrap()
                    .expect("no product within 60 s");
                writeln!(out, "{line}").unwrap();
            }
            writeln!(out, "skipped {}", follower.skipped()).unwrap();
        }
        other => panic!("unknown child role {other}"),
    }
}

const PRODUCTS_PER_INSERTER: u32 = 1500;

fn spawn_child(role: &str, queue: &Path, arg: u32) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "processes::child", "--nocapture", "--test-threads", "1", "-q"])
        .env(CHILD_ROLE, role)
        .env(CHILD_QUEUE, queue)
        .env(CHILD_ARG, arg.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads lines of a child's stdout that our child code printed (libtest adds its own lines).
fn child_lines(child: &mut Child) -> impl Iterator<Item = String> + '_ {
    BufReader::new(child.stdout.as_mut().unwrap()).lines().map(Result::unwrap)
}

fn wait_for_line(child: &mut Child, wanted: &str) {
    for line in child_lines(child) {
        if line == wanted {
            return;
        }
    }
    panic!("child ended before printing {wanted:?}");
}

fn new_queue(capacity: Capacity) -> (tempfile::TempDir, PathBuf) {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    drop(Queue::create(&path, capacity, false).unwrap());
    (directory, path)
}

#[test]
fn two_inserters_and_three_readers_see_every_product_once_in_order() {
    let (_directory, path) = new_queue(Capacity { bytes: 400_000_000, slots: 10_000 });
    let total = 2 * PRODUCTS_PER_INSERTER;
    let mut readers: Vec<Child> = (0..3).map(|_| spawn_child("reader", &path, total)).collect();
    for reader in &mut readers {
        wait_for_line(reader, "ready");
    }
    let inserters: Vec<Child> = (0..2).map(|inserter| spawn_child("inserter", &path, inserter)).collect();
    for mut inserter in inserters {
        assert!(inserter.wait().unwrap().success());
    }
    let queue = Queue::open(&path).unwrap();
    let snapshot = queue.snapshot().unwrap();
    let expected: Vec<String> = snapshot
        .products_from(Timestamp::ZERO)
        .unwrap()
        .map(|product| {
            let product = product.unwrap();
            format!("{} {}", product.insertion.as_unix_micros(), product.info.signature)
        })
        .collect();
    drop(snapshot);
    assert_eq!(expected.len(), total as usize);
    for mut reader in readers {
        let lines: Vec<String> =
            child_lines(&mut reader).filter(|line| !line.is_empty()).take(total as usize + 1).collect();
        assert!(reader.wait().unwrap().success());
        let seen: Vec<String> =
            lines.iter().filter(|line| !line.starts_with("skipped")).take(total as usize).cloned().collect();
        assert_eq!(seen, expected, "a reader saw other products or another order");
        assert!(lines.contains(&"skipped 0".to_owned()), "{:?}", lines.last());
        let unique: HashSet<&String> = seen.iter().collect();
        assert_eq!(unique.len(), seen.len());
    }
    // Each inserter's products are in the order it inserted them.
    let snapshot = queue.snapshot().unwrap();
    let mut last_seqno = [None::<u32>; 2];
    for product in snapshot.products_from(Timestamp::ZERO).unwrap() {
        let product = product.unwrap();
        let inserter: usize = product.info.origin.trim_start_matches("inserter").parse().unwrap();
        assert!(last_seqno[inserter].is_none_or(|last| last < product.info.seqno));
        last_seqno[inserter] = Some(product.info.seqno);
    }
}

#[test]
fn killing_an_inserter_mid_insert_never_damages_the_queue() {
    // Small enough that it evicts all the time, so kills also land mid-eviction.
    let (_directory, path) = new_queue(Capacity { bytes: 20_000_000, slots: 200 });
    let mut inserted_before = 0;
    for round in 0..50u32 {
        let first = round * 100_000;
        let mut inserter = spawn_child("endless-inserter", &path, first);
        // The kill lands at a different point of the insert stream each round: in the insert
        // of a pseudo-random product after the first (or the first announced at or after it:
        // the lines are read by one reader, so none is skipped, but the child goes on).
        let target = first + 1 + round * 7919 % 20;
        {
            let mut lines = child_lines(&mut inserter);
            assert!(lines.by_ref().any(|line| line == "started"), "child ended before it started");
            let announced = |line: &String| {
                line.strip_prefix("inserting ").and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n >= target)
            };
            assert!(lines.any(|line| announced(&line)), "child ended before inserting {target}");
        }
        inserter.kill().unwrap();
        inserter.wait().unwrap();

        let queue = Queue::open(&path).unwrap();
        let report = queue.check().unwrap();
        assert!(report.is_ok(), "round {round}: {:?}", report.problems);
        let snapshot = queue.snapshot().unwrap();
        for product in snapshot.products_from(Timestamp::ZERO).unwrap() {
            let product = product.unwrap();
            assert_eq!(Signature::md5_of(product.data), product.info.signature, "round {round}: torn product");
        }
        drop(snapshot);
        let inserted = queue.stats().unwrap().inserted_count;
        assert!(inserted > inserted_before, "round {round}: no progress");
        inserted_before = inserted;
    }
}
