//! Product-queue behaviour: capacities, eviction, duplicates, cursors, checks, and a property
//! test against a simple in-memory model.

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::time::Duration;

use ldm7_pq::{Capacity, CreateError, InsertError, InsertOutcome, OpenError, Queue};
use ldm7_testkit::wait_until;
use ldm7_types::{FeedType, ProdInfo, Signature, Timestamp};
use proptest::prelude::*;

fn product(ident: &str, data: &[u8]) -> ProdInfo {
    ProdInfo {
        arrival: Timestamp::from_unix_micros(1_434_326_400_000_000),
        signature: Signature::md5_of(data),
        origin: "origin.example".into(),
        feedtype: FeedType::NGRID,
        seqno: 1,
        ident: ident.into(),
        size: data.len() as u32,
    }
}

/// Stored size of a product made by `product` (header 48 + origin + ident + data).
fn stored_len(ident: &str, data_len: usize) -> u64 {
    (48 + "origin.example".len() + ident.len() + data_len) as u64
}

#[test]
fn insert_read_and_duplicate() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    let queue = Queue::create(&path, Capacity { bytes: 1 << 20, slots: 100 }, false).unwrap();
    let info = product("a", b"hello");
    let outcome = queue.insert(&info, b"hello").unwrap();
    let InsertOutcome::Inserted { insertion, queue_seq: 0, evicted: 0 } = outcome else { panic!("{outcome:?}") };
    assert_eq!(queue.insert(&info, b"hello").unwrap(), InsertOutcome::Duplicate { existing: insertion });

    let snapshot = queue.snapshot().unwrap();
    let found = snapshot.product_by_signature(&info.signature).unwrap().unwrap();
    assert_eq!(found.info, info);
    assert_eq!(found.data, b"hello");
    assert_eq!(found.insertion, insertion);
    drop(snapshot);

    let stats = queue.stats().unwrap();
    assert_eq!(stats.product_count, 1);
    assert_eq!(stats.used_bytes, stored_len("a", 5));
    assert!(queue.check().unwrap().is_ok());
}

#[test]
fn streamed_inserts_write_in_chunks_and_insert_nothing_on_failure() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1 << 20, slots: 100 }, false).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|n| (n % 251) as u8).collect();
    let info = product("streamed", &data);
    let fill = |out: &mut dyn std::io::Write| {
        for chunk in data.chunks(7_000) {
            out.write_all(chunk)?;
        }
        Ok(())
    };
    let InsertOutcome::Inserted { .. } = queue.insert_streamed(&info, fill).unwrap() else { panic!() };
    let snapshot = queue.snapshot().unwrap();
    assert_eq!(snapshot.product_by_signature(&info.signature).unwrap().unwrap().data, &data[..]);
    drop(snapshot);
    assert!(matches!(queue.insert_streamed(&info, |_| unreachable!()).unwrap(), InsertOutcome::Duplicate { .. }));

    let other = product("short", b"0123456789");
    let short = queue.insert_streamed(&other, |out| out.write_all(b"01234"));
    assert!(matches!(short, Err(InsertError::Source(_))), "{short:?}");
    let failing = queue.insert_streamed(&other, |_| Err(std::io::Error::other("disk gone")));
    assert!(matches!(failing, Err(InsertError::Source(error)) if error.to_string() == "disk gone"));
    assert_eq!(queue.stats().unwrap().product_count, 1, "nothing inserted by the failures");
    assert!(queue.check().unwrap().is_ok());
    let InsertOutcome::Inserted { .. } = queue.insert_streamed(&other, |out| out.write_all(b"0123456789")).unwrap()
    else {
        panic!()
    };
}

#[test]
fn create_refuses_to_overwrite_and_open_reports_missing() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    let capacity = Capacity { bytes: 1 << 20, slots: 10 };
    drop(Queue::create(&path, capacity, false).unwrap());
    assert!(matches!(Queue::create(&path, capacity, false), Err(CreateError::Exists(_))));
    drop(Queue::create(&path, capacity, true).unwrap());
    let other = directory.path().join("not-a-queue");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("precious"), b"x").unwrap();
    assert!(matches!(Queue::create(&other, capacity, true), Err(CreateError::NotAQueue(_))));
    assert!(other.join("precious").exists());
    assert!(matches!(Queue::open(&directory.path().join("absent")), Err(OpenError::Missing(_))));
    assert!(matches!(Queue::open(&other), Err(OpenError::NotAQueue { .. })));
}

#[test]
fn a_queue_larger_than_the_free_space_is_refused_and_leaves_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    let capacity = Capacity { bytes: 1 << 45, slots: 10 };
    let error = Queue::create(&path, capacity, false).unwrap_err();
    let CreateError::NoSpace { needed, free, .. } = error else { panic!("{error}") };
    assert!(needed > free && needed > 1 << 45, "{needed} {free}");
    assert!(error.to_string().contains("choose a smaller --size"), "{error}");
    assert!(!path.exists(), "nothing is left behind");
}

#[test]
fn every_byte_of_a_new_queue_has_its_disk_block_and_holes_are_refused() {
    use std::os::unix::fs::MetadataExt;
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    let queue = Queue::create(&path, Capacity { bytes: 1 << 20, slots: 10 }, false).unwrap();
    let map_bytes = queue.stats().unwrap().map_bytes;
    for name in [ldm7_pq::DATA_FILE, ldm7_pq::LOCK_FILE, ldm7_pq::NOTIFY_FILE] {
        let metadata = std::fs::metadata(path.join(name)).unwrap();
        assert!(
            metadata.blocks() * 512 >= metadata.len(),
            "{name}: {} blocks for {} bytes",
            metadata.blocks(),
            metadata.len()
        );
    }
    assert_eq!(std::fs::metadata(path.join(ldm7_pq::DATA_FILE)).unwrap().len(), map_bytes, "the file is the map");
    let names: Vec<_> = std::fs::read_dir(directory.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(names, ["q"], "nothing is left beside the queue");
    assert!(queue.check().unwrap().is_ok());
    drop(queue);
    // A data file cut short (LMDB would size it up again, with a hole) is refused, unchanged.
    let data = std::fs::OpenOptions::new().write(true).open(path.join(ldm7_pq::DATA_FILE)).unwrap();
    data.set_len(map_bytes / 2).unwrap();
    let error = Queue::open(&path).unwrap_err();
    assert!(matches!(error, OpenError::Damaged { .. }), "{error}");
    assert!(error.to_string().contains("shorter than"), "{error}");
    assert_eq!(data.metadata().unwrap().len(), map_bytes / 2, "refused before LMDB touched it");
    // Given its length back as a hole, it is refused for the hole.
    data.set_len(map_bytes).unwrap();
    let error = Queue::open(&path).unwrap_err();
    assert!(error.to_string().contains("have disk space"), "{error}");
}

#[test]
fn too_big_and_invalid_products_are_refused_and_nothing_changes() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1000, slots: 10 }, false).unwrap();
    let data = vec![7u8; 2000];
    assert!(matches!(queue.insert(&product("big", &data), &data), Err(InsertError::TooBig { .. })));
    let mut wrong_size = product("x", b"abc");
    wrong_size.size = 4;
    assert!(matches!(queue.insert(&wrong_size, b"abc"), Err(InsertError::Invalid(_))));
    assert_eq!(queue.stats().unwrap().product_count, 0);
}

#[test]
fn oldest_products_are_evicted_by_slots_and_by_bytes() {
    let directory = tempfile::tempdir().unwrap();
    let capacity = Capacity { bytes: 4 * stored_len("p0", 100), slots: 3 };
    let queue = Queue::create(&directory.path().join("q"), capacity, false).unwrap();
    for index in 0..5u8 {
        let data = vec![index; 100];
        queue.insert(&product(&format!("p{index}"), &data), &data).unwrap();
    }
    let snapshot = queue.snapshot().unwrap();
    let idents: Vec<String> =
        snapshot.products_from(Timestamp::ZERO).unwrap().map(|product| product.unwrap().info.ident).collect();
    assert_eq!(idents, ["p2", "p3", "p4"]);
    drop(snapshot);
    let stats = queue.stats().unwrap();
    assert_eq!(stats.evicted_count, 2);
    assert!(stats.mvrt.is_some());
    // A product of three times the size needs the byte capacity of three old ones.
    let data = vec![9u8; 300];
    let outcome = queue.insert(&product("p5", &data), &data).unwrap();
    assert!(matches!(outcome, InsertOutcome::Inserted { evicted: 2, .. }), "{outcome:?}");
    assert!(queue.check().unwrap().is_ok());
}

#[test]
fn insertion_times_are_unique_even_when_the_clock_stands_still_or_goes_back() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1 << 20, slots: 100 }, false).unwrap();
    let now = Timestamp::from_unix_micros(2_000_000_000_000_000);
    let mut keys = Vec::new();
    for (index, clock) in [now, now, now.saturating_sub(Duration::from_secs(10)), now].into_iter().enumerate() {
        let data = [index as u8];
        match queue.insert_at(clock, &product("x", &data), &data).unwrap() {
            InsertOutcome::Inserted { insertion, .. } => keys.push(insertion.as_unix_micros()),
            other => panic!("{other:?}"),
        }
    }
    assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "{keys:?}");
}

#[test]
fn follower_sees_products_in_order_and_waits_for_new_ones() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    let queue = Queue::create(&path, Capacity { bytes: 1 << 20, slots: 100 }, false).unwrap();
    queue.insert(&product("first", b"1"), b"1").unwrap();
    let mut follower = queue.follow(Timestamp::ZERO);
    let first = follower.next_owned(Some(Duration::from_millis(10))).unwrap().unwrap();
    assert_eq!(first.info.ident, "first");
    assert!(follower.next_owned(Some(Duration::from_millis(10))).unwrap().is_none());
    // This thread follows; the other inserts once it waits (the case under test): the queue's
    // notify file counts a waiter and this thread sleeps.
    let follower_thread = Path::new("/proc").join(std::fs::read_link("/proc/thread-self").unwrap());
    std::thread::scope(|scope| {
        scope.spawn(|| {
            wait_until(Duration::from_secs(10), "the follower to wait", || {
                (notify_waiters(&path) > 0 && thread_state(&follower_thread) == Some('S')).then_some(())
            });
            queue.insert(&product("second", b"2"), b"2").unwrap();
        });
        let second = follower.next_owned(Some(Duration::from_secs(10))).unwrap().unwrap();
        assert_eq!(second.info.ident, "second");
    });
    assert_eq!(follower.skipped(), 0);
}

/// How many processes wait on the queue at `path`: the second 32-bit word of its notify file
/// (the first counts changes).
fn notify_waiters(path: &Path) -> u32 {
    let notify = std::fs::read(path.join("notify")).unwrap();
    u32::from_ne_bytes(notify[4..8].try_into().unwrap())
}

/// The state letter of a thread (`/proc/PID/task/TID`), as `/proc` shows it (`S`: sleeping).
fn thread_state(thread: &Path) -> Option<char> {
    let stat = std::fs::read_to_string(thread.join("stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[test]
fn follower_counts_products_evicted_before_it_read_them() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1 << 20, slots: 2 }, false).unwrap();
    queue.insert(&product("a", b"a"), b"a").unwrap();
    let mut follower = queue.follow(Timestamp::ZERO);
    follower.next_owned(None).unwrap().unwrap();
    for name in ["b", "c", "d", "e"] {
        queue.insert(&product(name, name.as_bytes()), name.as_bytes()).unwrap();
    }
    assert_eq!(follower.next_owned(None).unwrap().unwrap().info.ident, "d");
    assert_eq!(follower.skipped(), 2);
}

#[test]
fn a_snapshot_keeps_an_evicted_product_readable() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1 << 20, slots: 1 }, false).unwrap();
    let data = vec![1u8; 50_000];
    queue.insert(&product("old", &data), &data).unwrap();
    let snapshot = queue.snapshot().unwrap();
    let old = snapshot.product_at_or_after(Timestamp::ZERO).unwrap().unwrap();
    for index in 0..20u8 {
        let other = vec![index + 2; 50_000];
        queue.insert(&product("new", &other), &other).unwrap();
    }
    assert!(old.data.iter().all(|&byte| byte == 1));
    assert_eq!(old.info.ident, "old");
}

#[test]
fn a_batch_packs_its_records_into_fewer_pages_and_reads_them_back() {
    let directory = tempfile::tempdir().unwrap();
    let capacity = Capacity { bytes: 8 << 20, slots: 1000 };
    let single = Queue::create(&directory.path().join("single"), capacity, false).unwrap();
    let batched = Queue::create(&directory.path().join("batched"), capacity, false).unwrap();
    // 33 records of 30,100 bytes: eight 4 KiB pages each alone, 243 pages packed together.
    let products: Vec<(ProdInfo, Vec<u8>)> = (0..33u32)
        .map(|n| {
            let data: Vec<u8> = (0..30_100 - stored_len("p000", 0) as u32).map(|k| (k * 7 + n) as u8).collect();
            (product(&format!("p{n:03}"), &data), data)
        })
        .collect();
    let written = |queue: &Queue| queue.stats().unwrap().map_written_bytes;
    let (single_before, batched_before) = (written(&single), written(&batched));
    for (info, data) in &products {
        single.insert(info, data).unwrap();
    }
    let pairs: Vec<(&ProdInfo, &[u8])> = products.iter().map(|(info, data)| (info, &data[..])).collect();
    batched.insert_batch(&pairs).unwrap();
    let (single_pages, batched_pages) =
        ((written(&single) - single_before) / 4096, (written(&batched) - batched_before) / 4096);
    assert!(single_pages >= 264, "{single_pages}");
    assert!(batched_pages <= 250, "{batched_pages} pages packed, {single_pages} one by one");
    assert_eq!(single.stats().unwrap().used_bytes, batched.stats().unwrap().used_bytes);
    // Read by signature, in order, and kept by a snapshot while their extent is evicted.
    let snapshot = batched.snapshot().unwrap();
    for (info, data) in &products {
        let stored = snapshot.product_by_signature(&info.signature).unwrap().unwrap();
        assert_eq!((&stored.info, stored.data), (info, &data[..]));
    }
    let in_order: Vec<String> =
        snapshot.products_from(Timestamp::ZERO).unwrap().map(|product| product.unwrap().info.ident).collect();
    assert_eq!(in_order, products.iter().map(|(info, _)| info.ident.clone()).collect::<Vec<_>>());
    let newest_first = snapshot.products_before_reversed(Timestamp::from_unix_micros(i64::MAX)).unwrap();
    assert_eq!(newest_first.map(|product| product.unwrap().info.ident).next().as_deref(), Some("p032"));
    let big = vec![9u8; (8 << 20) - 1000];
    batched.insert(&product("big", &big), &big).unwrap();
    assert_eq!(batched.stats().unwrap().product_count, 1, "the batch evicted");
    let first = snapshot.product_at_or_after(Timestamp::ZERO).unwrap().unwrap();
    assert_eq!((first.info.ident.as_str(), first.data), ("p000", &products[0].1[..]));
    drop(snapshot);
    let report = batched.check().unwrap();
    assert!(report.is_ok(), "{report:?}");
    // The extent's pages are reused: the same batch again fits without growing the map.
    let grown = written(&batched);
    let small = vec![1u8; 100];
    batched.insert(&product("small", &small), &small).unwrap();
    batched.insert_batch(&pairs).unwrap();
    assert!(written(&batched) <= grown + (8 << 20), "the map stays within its size");
    assert!(batched.check().unwrap().is_ok());
}

#[test]
fn reopen_keeps_products_and_capacity() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("q");
    let capacity = Capacity { bytes: 10_000_000, slots: 50 };
    {
        let queue = Queue::create(&path, capacity, false).unwrap();
        queue.insert(&product("kept", b"kept"), b"kept").unwrap();
    }
    let queue = Queue::open(&path).unwrap();
    assert_eq!(queue.capacity(), capacity);
    assert_eq!(queue.stats().unwrap().product_count, 1);
}

/// One step of the model test.
#[derive(Clone, Debug)]
enum Step {
    /// Insert a product of this size with this content id (equal ids are duplicates).
    Insert { size: usize, content: u8 },
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let size = prop_oneof![0usize..200, 200usize..5000, 5000usize..40_000];
    prop::collection::vec((size, 0u8..60).prop_map(|(size, content)| Step::Insert { size, content }), 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// The queue behaves like a FIFO of (signature, length) bounded by bytes and slots.
    #[test]
    fn queue_matches_model(steps in steps(), bytes in 20_000u64..120_000, slots in 1u64..40) {
        let directory = tempfile::tempdir().unwrap();
        let queue = Queue::create(&directory.path().join("q"), Capacity { bytes, slots }, false).unwrap();
        let mut model: VecDeque<(Signature, u64)> = VecDeque::new();
        for step in steps {
            let Step::Insert { size, content } = step;
            let data = vec![content; size];
            let mut info = product("model", &data);
            info.signature = Signature::md5_of(&[content, (size % 251) as u8]);
            let stored = stored_len("model", size);
            let result = queue.insert(&info, &data);
            if stored > bytes {
                let too_big = matches!(result, Err(InsertError::TooBig { .. }));
                prop_assert!(too_big);
                continue;
            }
            if model.iter().any(|(signature, _)| *signature == info.signature) {
                let duplicate = matches!(result, Ok(InsertOutcome::Duplicate { .. }));
                prop_assert!(duplicate);
                continue;
            }
            let mut used: u64 = model.iter().map(|(_, len)| len).sum();
            let mut evicted = 0;
            while !model.is_empty() && (model.len() as u64 + 1 > slots || used + stored > bytes) {
                used -= model.pop_front().unwrap().1;
                evicted += 1;
            }
            model.push_back((info.signature, stored));
            let outcome = result.unwrap();
            let is_expected = matches!(outcome, InsertOutcome::Inserted { evicted: actual, .. } if actual == evicted);
            prop_assert!(is_expected, "{:?}", outcome);

            let stats = queue.stats().unwrap();
            prop_assert!(stats.used_bytes <= bytes);
            prop_assert!(stats.product_count <= slots);
            prop_assert_eq!(stats.product_count, model.len() as u64);
            prop_assert_eq!(stats.used_bytes, model.iter().map(|(_, len)| len).sum::<u64>());
        }
        let snapshot = queue.snapshot().unwrap();
        let stored: Vec<Signature> =
            snapshot.products_from(Timestamp::ZERO).unwrap().map(|product| product.unwrap().info.signature).collect();
        let expected: Vec<Signature> = model.iter().map(|(signature, _)| *signature).collect();
        prop_assert_eq!(&stored, &expected);
        let unique: HashSet<_> = stored.iter().collect();
        prop_assert_eq!(unique.len(), stored.len());
        drop(snapshot);
        prop_assert!(queue.check().unwrap().is_ok());
    }
}

#[test]
fn a_batch_with_one_bad_product_inserts_nothing() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1000, slots: 10 }, false).unwrap();
    let small = vec![1u8; 10];
    let big = vec![2u8; 2000];
    let (small_info, big_info) = (product("small", &small), product("big", &big));
    let result = queue.insert_batch(&[(&small_info, &small), (&big_info, &big)]);
    assert!(matches!(result, Err(InsertError::TooBig { .. })), "{result:?}");
    assert_eq!(queue.stats().unwrap().product_count, 0);
    assert!(queue.insert_batch(&[]).unwrap().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// Inserting in batches stores exactly what inserting one by one stores, with the same
    /// outcomes (evictions inside a batch and duplicates within it included).
    #[test]
    fn batches_match_single_inserts(
        steps in steps(),
        cuts in prop::collection::vec(1usize..12, 1..40),
        slots in 1u64..40,
        bytes in prop_oneof![Just(60_000u64), Just(400_000)],
    ) {
        let directory = tempfile::tempdir().unwrap();
        let single = Queue::create(&directory.path().join("single"), Capacity { bytes, slots }, false).unwrap();
        let batched = Queue::create(&directory.path().join("batched"), Capacity { bytes, slots }, false).unwrap();
        let products: Vec<(ProdInfo, Vec<u8>)> = steps
            .into_iter()
            .map(|Step::Insert { size, content }| {
                let data = vec![content; size];
                let mut info = product("batch", &data);
                info.signature = Signature::md5_of(&[content, (size % 251) as u8]);
                (info, data)
            })
            .filter(|(_, data)| stored_len("batch", data.len()) <= bytes)
            .collect();
        let expected: Vec<InsertOutcome> =
            products.iter().map(|(info, data)| single.insert(info, data).unwrap()).collect();
        let mut outcomes = Vec::new();
        let mut rest = &products[..];
        for cut in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (batch, after) = rest.split_at((*cut).min(rest.len()));
            let pairs: Vec<(&ProdInfo, &[u8])> = batch.iter().map(|(info, data)| (info, &data[..])).collect();
            outcomes.extend(batched.insert_batch(&pairs).unwrap());
            // Packed records and their extents stay consistent through every eviction.
            let report = batched.check().unwrap();
            prop_assert!(report.is_ok(), "{:?}", report);
            rest = after;
        }
        prop_assert_eq!(outcomes.len(), expected.len());
        for (got, want) in outcomes.iter().zip(&expected) {
            let same = match (got, want) {
                (InsertOutcome::Inserted { evicted: a, queue_seq: x, .. }, InsertOutcome::Inserted { evicted: b, queue_seq: y, .. }) => a == b && x == y,
                (InsertOutcome::Duplicate { .. }, InsertOutcome::Duplicate { .. }) => true,
                _ => false,
            };
            prop_assert!(same, "{:?} vs {:?}", got, want);
        }
        let contents = |queue: &Queue| -> Vec<(Signature, Vec<u8>)> {
            let snapshot = queue.snapshot().unwrap();
            snapshot.products_from(Timestamp::ZERO).unwrap().map(|product| {
                let product = product.unwrap();
                (product.info.signature, product.data.to_vec())
            }).collect()
        };
        prop_assert_eq!(contents(&batched), contents(&single));
        prop_assert_eq!(batched.stats().unwrap().used_bytes, single.stats().unwrap().used_bytes);
        prop_assert!(batched.check().unwrap().is_ok());
    }
}

#[test]
fn filled_inserts_write_the_reserved_slice_and_insert_nothing_on_failure() {
    let directory = tempfile::tempdir().unwrap();
    let queue = Queue::create(&directory.path().join("q"), Capacity { bytes: 1 << 20, slots: 100 }, false).unwrap();
    let data: Vec<u8> = (0..50_000u32).map(|n| (n % 241) as u8).collect();
    let info = product("filled", &data);
    let failing = queue.insert_filled(&info, |_| Err(std::io::Error::other("file changed")));
    assert!(matches!(failing, Err(InsertError::Source(error)) if error.to_string() == "file changed"));
    assert_eq!(queue.stats().unwrap().product_count, 0, "nothing inserted by the failure");
    let outcome = queue
        .insert_filled(&info, |slice| {
            assert_eq!(slice.len(), data.len());
            slice.copy_from_slice(&data);
            Ok(())
        })
        .unwrap();
    assert!(matches!(outcome, InsertOutcome::Inserted { .. }), "{outcome:?}");
    queue.set_release_pages(true);
    let small = b"small product".to_vec();
    let small_info = product("small", &small);
    queue
        .insert_filled(&small_info, |slice| {
            slice.copy_from_slice(&small);
            Ok(())
        })
        .unwrap();
    let snapshot = queue.snapshot().unwrap();
    assert_eq!(snapshot.product_by_signature(&info.signature).unwrap().unwrap().data, &data[..]);
    assert_eq!(snapshot.product_by_signature(&small_info.signature).unwrap().unwrap().data, &small[..]);
    drop(snapshot);
    assert!(matches!(queue.insert_filled(&info, |_| unreachable!()).unwrap(), InsertOutcome::Duplicate { .. }));
    assert!(queue.check().unwrap().is_ok());
}
