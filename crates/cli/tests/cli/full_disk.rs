//! A full disk is survived, never crashed on (issue #16): the queue on a small tmpfs that fills
//! up at each step — `queue create`, `insert`, `serve` receiving — gives a clear error with exit
//! status 1 or 2, never a signal; `queue check` right afterwards tells a sound queue from a
//! damaged one; products accepted before the disk filled are still there.
//!
//! The tmpfs tests need root (mount); the others run anywhere on the temporary directory.

use crate::support;

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use ldm7_pq::Queue;
use ldm7_testkit::{skip_unless_root, wait_until};
use ldm7_types::Timestamp;
use nix::fcntl::{FallocateFlags, fallocate};

use crate::support::{LDM7, Node};

/// A tmpfs of `size_bytes` mounted on a fresh directory; unmounted (lazily, so a process still
/// inside cannot keep it) and removed when dropped, even when the test fails.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_bytes: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs on {}: {status}", dir.path().display());
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn free_bytes(&self) -> u64 {
        let stats = nix::sys::statvfs::statvfs(self.dir.path()).expect("statvfs");
        stats.blocks_available() * stats.fragment_size()
    }

    /// Fills the file system until `leave_bytes` are free (a filler file with its blocks).
    fn fill_leaving(&self, leave_bytes: u64) {
        let take = self.free_bytes().saturating_sub(leave_bytes);
        if take > 0 {
            take_space(&self.path(&format!("filler-{}", ldm7_testkit::unique())), take).expect("fill the tmpfs");
        }
        assert_eq!(self.free_bytes(), leave_bytes.min(self.free_bytes()), "filled");
    }

    /// Fills the file system completely.
    fn fill(&self) {
        self.fill_leaving(0);
        assert_eq!(self.free_bytes(), 0);
    }

    /// Removes the filler files.
    fn unfill(&self) {
        for entry in std::fs::read_dir(self.dir.path()).expect("read tmpfs") {
            let path = entry.expect("entry").path();
            if path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("filler-")) {
                std::fs::remove_file(path).expect("remove filler");
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// A file at `path` with `len` bytes of blocks (fewer if the file system runs out).
fn take_space(path: &Path, len: u64) -> nix::Result<()> {
    let file = File::create(path).expect("create filler");
    fallocate(&file, FallocateFlags::empty(), 0, len as nix::libc::off_t)
}

fn ldm7(args: &[&str]) -> Output {
    Command::new(LDM7).args(args).env_remove("LDM7_QUEUE").output().expect("run ldm7")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit status 0, 1 or 2 — never a signal; returns the code.
fn exit_code(args: &[&str], output: &Output) -> i32 {
    assert_eq!(
        output.status.signal(),
        None,
        "ldm7 {args:?} died of a signal: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    let code = output.status.code().expect("an exit code");
    assert!((0..=2).contains(&code), "ldm7 {args:?} exited {code}: {}", text(&output.stderr));
    code
}

fn ok(args: &[&str]) -> String {
    let output = ldm7(args);
    assert_eq!(exit_code(args, &output), 0, "ldm7 {args:?}: {}", text(&output.stderr));
    text(&output.stdout)
}

/// Fails with exit status 1 or 2 (no signal); returns standard error.
fn fails(args: &[&str]) -> String {
    let output = ldm7(args);
    assert_ne!(exit_code(args, &output), 0, "ldm7 {args:?} succeeded: {}", text(&output.stdout));
    text(&output.stderr)
}

fn sound(queue: &str) {
    let report = ok(&["queue", "check", "--path", queue]);
    assert!(report.contains("queue is sound"), "{report}");
}

fn product_file(dir: &Path, index: usize, len: usize) -> String {
    let path = dir.join(format!("product-{index}"));
    let data: Vec<u8> = (0..len).map(|at| (at * 31 + index * 7) as u8).collect();
    std::fs::write(&path, data).expect("write product");
    path.display().to_string()
}

/// Identifiers of the products in the queue.
fn idents(queue: &str) -> Vec<String> {
    let queue = Queue::open(Path::new(queue)).expect("open");
    let snapshot = queue.snapshot().expect("snapshot");
    snapshot
        .products_from(Timestamp::ZERO)
        .expect("iterate")
        .map(|product| product.expect("product").info.ident)
        .collect()
}

/// The product identifiers `ldm7 insert` gives files: their names.
fn names(files: &[String]) -> Vec<String> {
    files.iter().map(|file| Path::new(file).file_name().expect("name").to_string_lossy().into_owned()).collect()
}

/// Leftovers of a creation beside the queue (`q.pq.tmp-PID`).
fn builds_beside(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".tmp-"))
        .collect()
}

#[test]
fn create_with_the_disk_filling_at_each_step() {
    if !skip_unless_root("create_with_the_disk_filling_at_each_step") {
        return;
    }
    let disk = Tmpfs::mount(40 << 20);
    let queue = disk.path("q.pq").display().to_string();
    let create = ["queue", "create", "--path", queue.as_str(), "--size", "4M", "--slots", "100"];
    // What a queue takes, measured on the empty disk.
    let empty = disk.free_bytes();
    ok(&create);
    let needed = empty - disk.free_bytes();
    std::fs::remove_dir_all(&queue).expect("remove");
    let products = tempfile::tempdir().expect("tempdir");
    let product = product_file(products.path(), 0, 50_000);
    // Free space from three pages short to twenty pages over: every step of a creation (lock
    // file, notify file, LMDB's meta pages, the data file's zeros, the tables) meets the end.
    for pages in -3i64..=20 {
        let leave = needed.saturating_add_signed(pages * 4096);
        disk.fill_leaving(leave);
        let output = ldm7(&create);
        match exit_code(&create, &output) {
            0 => {
                assert!(pages >= 0, "a queue of {needed} bytes was made with {leave} free");
                // The queue's space is its own: a full disk changes nothing for it.
                disk.fill();
                sound(&queue);
                ok(&["insert", "--queue", &queue, &product]);
                sound(&queue);
                assert_eq!(idents(&queue).len(), 1);
                std::fs::remove_dir_all(&queue).expect("remove");
            }
            _ => {
                let error = text(&output.stderr);
                assert!(pages < 0, "{leave} bytes free, {needed} needed: {error}");
                assert!(error.contains("free") && error.contains("--size"), "{error}");
                assert!(!Path::new(&queue).exists(), "a failed creation left {queue}");
                let error = fails(&["queue", "check", "--path", &queue]);
                assert!(error.contains("no product queue"), "{error}");
            }
        }
        assert_eq!(builds_beside(disk.dir.path()), Vec::<String>::new());
        disk.unfill();
    }
}

/// `queue create --force` replaces a queue only once the new one is whole: on a disk without room
/// for the new queue, even with the old one's space, the old queue and its products stay as they
/// were; with room only counting the old one's space, the old one makes way; with room beside it,
/// the two are exchanged.
#[test]
fn force_on_a_full_disk_leaves_the_old_queue_as_it_was() {
    if !skip_unless_root("force_on_a_full_disk_leaves_the_old_queue_as_it_was") {
        return;
    }
    let disk = Tmpfs::mount(40 << 20);
    let queue = disk.path("q.pq").display().to_string();
    let products = tempfile::tempdir().expect("tempdir");
    let product = product_file(products.path(), 0, 50_000);
    let create = |size: &str| {
        ["queue", "create", "--path", &queue, "--size", size, "--slots", "100", "--force"].map(str::to_owned)
    };
    let run = |args: &[String]| ldm7(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let empty = disk.free_bytes();
    assert_eq!(exit_code(&["queue", "create"], &run(&create("4M"))), 0);
    let queue_bytes = empty - disk.free_bytes();
    ok(&["insert", "--queue", &queue, &product]);
    // No room for a 20M queue even with the 4M one's space: refused, the old queue untouched.
    disk.fill_leaving(queue_bytes / 2);
    let output = run(&create("20M"));
    assert_eq!(exit_code(&["queue", "create"], &output), 1, "{}", text(&output.stderr));
    let error = text(&output.stderr);
    assert!(error.contains("left as it was") && error.contains("--size"), "{error}");
    sound(&queue);
    assert_eq!(idents(&queue).len(), 1, "the old queue keeps its product");
    // Nor for a 4M one beside it with half a queue free; a 4M one fits in its place.
    let output = run(&create("4M"));
    assert_eq!(exit_code(&["queue", "create"], &output), 0, "{}", text(&output.stderr));
    sound(&queue);
    assert_eq!(idents(&queue).len(), 0, "a new queue");
    assert_eq!(builds_beside(disk.dir.path()), Vec::<String>::new());
    // With room beside it: built whole, then exchanged; the old one's space comes back.
    disk.unfill();
    ok(&["insert", "--queue", &queue, &product]);
    let free = disk.free_bytes();
    assert_eq!(exit_code(&["queue", "create"], &run(&create("4M"))), 0);
    sound(&queue);
    assert_eq!(idents(&queue).len(), 0, "a new queue");
    assert_eq!(builds_beside(disk.dir.path()), Vec::<String>::new());
    assert_eq!(disk.free_bytes(), free, "the old queue's space was given back");
}

#[test]
fn create_while_another_process_fills_the_disk() {
    if !skip_unless_root("create_while_another_process_fills_the_disk") {
        return;
    }
    let disk = Tmpfs::mount(48 << 20);
    let queue = disk.path("q.pq").display().to_string();
    let create = ["queue", "create", "--path", queue.as_str(), "--size", "12M"];
    let mut failures = 0;
    for _ in 0..10 {
        // Another process takes every free byte as soon as the creation starts building.
        let root = disk.dir.path().to_owned();
        let filler = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while builds_beside(&root).is_empty() && !root.join("q.pq").exists() {
                assert!(std::time::Instant::now() < deadline, "the creation never started");
            }
            let stats = nix::sys::statvfs::statvfs(&root).expect("statvfs");
            let free = stats.blocks_available() * stats.fragment_size();
            let _ = take_space(&root.join(format!("filler-{}", ldm7_testkit::unique())), free);
        });
        let output = ldm7(&create);
        filler.join().expect("filler");
        if exit_code(&create, &output) == 0 {
            sound(&queue);
            std::fs::remove_dir_all(&queue).expect("remove");
        } else {
            failures += 1;
            let error = text(&output.stderr);
            assert!(error.contains("file system"), "{error}");
            assert!(!Path::new(&queue).exists(), "a failed creation left {queue}");
        }
        assert_eq!(builds_beside(disk.dir.path()), Vec::<String>::new());
        disk.unfill();
    }
    eprintln!("{failures} of 10 creations met the full disk");
}

#[test]
fn inserts_into_a_queue_whose_disk_filled_up_lose_nothing() {
    if !skip_unless_root("inserts_into_a_queue_whose_disk_filled_up_lose_nothing") {
        return;
    }
    let disk = Tmpfs::mount(32 << 20);
    let queue = disk.path("q.pq").display().to_string();
    ok(&["queue", "create", "--path", &queue, "--size", "8M", "--slots", "100"]);
    let products = tempfile::tempdir().expect("tempdir");
    let files: Vec<String> = (0..40).map(|index| product_file(products.path(), index, 100_000)).collect();
    for file in &files[..10] {
        ok(&["insert", "--queue", &queue, file]);
    }
    disk.fill();
    // One at a time, then many at once (one transaction), then enough to evict the oldest.
    for file in &files[10..20] {
        ok(&["insert", "--queue", &queue, file]);
    }
    let mut batch = vec!["insert", "--queue", queue.as_str()];
    batch.extend(files[20..40].iter().map(String::as_str));
    ok(&batch);
    assert_eq!(disk.free_bytes(), 0, "the inserts took no space");
    sound(&queue);
    let held = idents(&queue);
    assert_eq!(held.len(), 40, "every accepted product is there: {held:?}");
    assert_eq!(held, names(&files), "in insertion order");
}

#[test]
fn act_holds_a_product_while_its_disk_is_full_and_files_everything_once_freed() {
    if !skip_unless_root("act_holds_a_product_while_its_disk_is_full_and_files_everything_once_freed") {
        return;
    }
    // The queue on a disk of its own (reserved: it never fills), the files on a small tmpfs.
    let home = tempfile::tempdir().expect("tempdir");
    let queue = home.path().join("q.pq").display().to_string();
    ok(&["queue", "create", "--path", &queue, "--size", "16M", "--slots", "100"]);
    let disk = Tmpfs::mount(4 << 20);
    let conf = home.path().join("pqact.conf");
    std::fs::write(&conf, "ANY\t^(product-.*)\tFILE\t-close\tdata/\\1\n").expect("pqact.conf");
    let log = home.path().join("act.log");
    let mut act = Command::new(LDM7)
        .args(["act", "-v", "-i", "1", "-l"])
        .arg(&log)
        .args(["-q", &queue, "-d"])
        .arg(disk.dir.path())
        .arg(&conf)
        .spawn()
        .expect("start ldm7 act");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(Duration::from_secs(20), "act to start", || log_text().contains("entries from").then_some(()));
    let products = tempfile::tempdir().expect("tempdir");
    let files: Vec<String> = (0..30).map(|index| product_file(products.path(), index, 100_000)).collect();
    for file in &files[..5] {
        ok(&["insert", "--queue", &queue, file]);
    }
    let filed = |index: usize| std::fs::metadata(disk.path(&format!("data/product-{index}"))).map_or(0, |m| m.len());
    wait_until(Duration::from_secs(20), "the first five filed", || (filed(4) == 100_000).then_some(()));
    // Room for half a product: the next write fails part-way.
    disk.fill_leaving(50_000);
    for file in &files[5..30] {
        ok(&["insert", "--queue", &queue, file]);
    }
    wait_until(Duration::from_secs(20), "act to hold for room", || {
        log_text().contains("holding this product until there is room").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(filed(5), 0, "the partial write was undone while held");
    assert_eq!(filed(6), 0, "nothing after the held product was processed");
    disk.unfill();
    wait_until(Duration::from_secs(30), "every product filed", || (filed(29) == 100_000).then_some(()));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(act.id() as i32), nix::sys::signal::Signal::SIGTERM)
        .expect("SIGTERM");
    assert!(act.wait().expect("wait").success());
    for (index, file) in files.iter().enumerate() {
        let want = std::fs::read(file).expect("product");
        let got = std::fs::read(disk.path(&format!("data/product-{index}"))).expect("filed");
        assert!(got == want, "product-{index} filed whole, once ({} bytes of {})", got.len(), want.len());
    }
    let text = log_text();
    assert_eq!(text.matches("holding this product until there is room").count(), 1, "said once:\n{text}");
    assert!(text.contains("works again"), "{text}");
    assert!(text.contains(" 0 failed"), "{text}");
}

#[test]
fn a_queue_made_by_an_older_ldm7_on_a_full_disk_is_refused_then_works() {
    if !skip_unless_root("a_queue_made_by_an_older_ldm7_on_a_full_disk_is_refused_then_works") {
        return;
    }
    let disk = Tmpfs::mount(24 << 20);
    let queue = disk.path("q.pq").display().to_string();
    ok(&["queue", "create", "--path", &queue, "--size", "4M", "--slots", "100"]);
    let products = tempfile::tempdir().expect("tempdir");
    let first = product_file(products.path(), 0, 10_000);
    ok(&["insert", "--queue", &queue, &first]);
    // An older ldm7 left the notify and lock files sparse (no process has the queue open).
    for name in ["notify", "lock.mdb"] {
        let file = std::fs::OpenOptions::new().write(true).open(Path::new(&queue).join(name)).expect("open");
        let len = file.metadata().expect("stat").len() as nix::libc::off_t;
        fallocate(&file, FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, len)
            .expect("punch");
    }
    disk.fill();
    let second = product_file(products.path(), 1, 10_000);
    let error = fails(&["insert", "--queue", &queue, &second]);
    assert!(error.contains("file system is full") && error.contains("free some space"), "{error}");
    disk.unfill();
    sound(&queue);
    ok(&["insert", "--queue", &queue, &second]);
    disk.fill();
    let third = product_file(products.path(), 2, 10_000);
    ok(&["insert", "--queue", &queue, &third]);
    sound(&queue);
    assert_eq!(idents(&queue), names(&[first, second, third]));
}

#[test]
fn a_damaged_data_file_is_refused_and_check_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let products = tempfile::tempdir().expect("tempdir");
    let product = product_file(products.path(), 0, 10_000);
    for damage in ["hole", "short"] {
        let queue = dir.path().join(format!("{damage}.pq")).display().to_string();
        ok(&["queue", "create", "--path", &queue, "--size", "4M", "--slots", "100"]);
        ok(&["insert", "--queue", &queue, &product]);
        let data = std::fs::OpenOptions::new().write(true).open(Path::new(&queue).join("data.mdb")).expect("open");
        let len = data.metadata().expect("stat").len();
        match damage {
            // A creation that stopped half-way (older ldm7 created in place) or a sparse copy:
            // the end of the file, which products have not reached yet, has no blocks.
            "hole" => fallocate(
                &data,
                FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
                (len / 2) as nix::libc::off_t,
                (len / 2) as nix::libc::off_t,
            )
            .expect("punch"),
            _ => data.set_len(len / 2).expect("truncate"),
        }
        drop(data);
        let output = ldm7(&["queue", "check", "--path", &queue]);
        assert_eq!(exit_code(&["queue", "check"], &output), 2, "{}", text(&output.stdout));
        let report = text(&output.stdout);
        let reason = if damage == "hole" { "have disk space" } else { "shorter than" };
        assert!(report.contains("problem:") && report.contains(reason), "{report}");
        assert!(text(&output.stderr).contains("queue create --force"), "{}", text(&output.stderr));
        let error = fails(&["insert", "--queue", &queue, &product]);
        assert!(error.contains("damaged") && error.contains(reason), "{error}");
        ok(&["queue", "create", "--path", &queue, "--size", "4M", "--force"]);
        sound(&queue);
    }
}

/// The moments of a creation a test kills it at, each seen in the file system (the order of
/// `Queue::create`: the build directory `q.pq.tmp-PID` beside the queue, its lock and notify
/// files, its data file written with zeros, the exchange with the queue there or the rename into
/// place).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CreationStage {
    AtOnce,
    BuildMade,
    LockReserved,
    NotifyReserved,
    DataFileMade,
    DataQuarterWritten,
    DataThreeQuartersWritten,
    Renamed,
}

impl CreationStage {
    const ALL: [CreationStage; 8] = [
        Self::AtOnce,
        Self::BuildMade,
        Self::LockReserved,
        Self::NotifyReserved,
        Self::DataFileMade,
        Self::DataQuarterWritten,
        Self::DataThreeQuartersWritten,
        Self::Renamed,
    ];

    /// The stages in the order the rounds kill at.
    const ROUNDS: [CreationStage; 8] = [
        Self::AtOnce,
        Self::Renamed,
        Self::BuildMade,
        Self::LockReserved,
        Self::NotifyReserved,
        Self::DataFileMade,
        Self::DataQuarterWritten,
        Self::DataThreeQuartersWritten,
    ];

    /// Whether a creation of `queue` building in `build` has got this far (once the stages
    /// before it were seen); `before` is the queue directory's inode when the creation began.
    fn reached(self, queue: &Path, build: &Path, before: Option<u64>) -> bool {
        use std::os::unix::fs::MetadataExt;
        let written = |numerator: u64| {
            std::fs::metadata(build.join("data.mdb"))
                .is_ok_and(|data| data.len() > 0 && data.blocks() * 512 * 4 >= data.len() * numerator)
        };
        match self {
            Self::AtOnce => true,
            Self::BuildMade => build.exists(),
            Self::LockReserved => build.join("lock.mdb").exists(),
            Self::NotifyReserved => build.join("notify").exists(),
            Self::DataFileMade => build.join("data.mdb").exists(),
            Self::DataQuarterWritten => written(1),
            Self::DataThreeQuartersWritten => written(3),
            Self::Renamed => {
                queue.join("data.mdb").exists() && std::fs::metadata(queue).ok().map(|queue| queue.ino()) != before
            }
        }
    }
}

#[test]
fn a_killed_creation_leaves_no_queue_and_the_next_one_cleans_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = dir.path().join("q.pq").display().to_string();
    let mut interrupted = 0;
    // A whole queue is made early on, so that a later round is killed while removing it.
    for stage in CreationStage::ROUNDS {
        let before = std::fs::metadata(&queue).ok().map(|queue| std::os::unix::fs::MetadataExt::ino(&queue));
        let mut child = Command::new(LDM7)
            .args(["queue", "create", "--path", &queue, "--size", "200M", "--force"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        // Killed once the creation shows this stage in the file system, each stage before it
        // seen in turn (or has ended first).
        let build = dir.path().join(format!("q.pq.tmp-{}", child.id()));
        for step in CreationStage::ALL.into_iter().filter(|step| *step <= stage) {
            wait_until(Duration::from_secs(60), &format!("the creation to reach {step:?}"), || {
                (step.reached(Path::new(&queue), &build, before) || child.try_wait().expect("try_wait").is_some())
                    .then_some(())
            });
        }
        let _ = child.kill();
        let status = child.wait().expect("wait");
        if status.signal().is_some() {
            interrupted += 1;
        }
        // Whatever the moment: no queue, or a whole one.
        let output = ldm7(&["queue", "check", "--path", &queue]);
        match exit_code(&["queue", "check"], &output) {
            0 => assert!(text(&output.stdout).contains("queue is sound")),
            code => {
                assert_eq!(code, 1, "{}{}", text(&output.stdout), text(&output.stderr));
                assert!(text(&output.stderr).contains("no product queue"), "{}", text(&output.stderr));
            }
        }
    }
    assert!(interrupted > 0, "no creation was interrupted");
    ok(&["queue", "create", "--path", &queue, "--size", "1M", "--force"]);
    assert_eq!(builds_beside(dir.path()), Vec::<String>::new(), "the next creation removes what killed ones left");
    sound(&queue);
}

#[test]
fn serve_receives_while_its_disk_is_full() {
    if !skip_unless_root("serve_receives_while_its_disk_is_full") {
        return;
    }
    let disk = Tmpfs::mount(48 << 20);
    let local = support::LOCAL;
    let mut node = Node::new(disk.dir.path(), "node", "8M", &format!("ALLOW ANY {local}\nACCEPT ANY .* {local}\n"));
    node.start();
    let products = tempfile::tempdir().expect("tempdir");
    let files: Vec<String> = (0..30).map(|index| product_file(products.path(), index, 100_000)).collect();
    let host = format!("127.0.0.1:{}", node.port);
    let mut send = vec!["send", "-h", host.as_str()];
    send.extend(files[..10].iter().map(String::as_str));
    ok(&send);
    node.wait_for(10, Duration::from_secs(30));
    // The queue, the server's state directory and its log are all on the full disk.
    disk.fill();
    let mut send = vec!["send", "-h", host.as_str()];
    send.extend(files[10..].iter().map(String::as_str));
    ok(&send);
    node.wait_for(30, Duration::from_secs(30));
    let running = node.exited();
    assert_eq!(running, None, "the server stopped on a full disk: {}", support::tail(&node.log()));
    wait_until(Duration::from_secs(5), "the server still serving", || support::listening(node.port).then_some(()));
    node.stop();
    sound(&node.queue_path());
    let (signatures, _) = node.verify();
    assert_eq!(signatures.len(), 30, "every received product is intact");
}
