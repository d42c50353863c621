//! The deletion rules on temporary trees (the comparison with LDM's binary is the cli crate's
//! integration test `scour::`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::conf::{Excludes, Resolver};
use crate::walk::{Job, Options, Outcome, Report, scour};
use crate::{Age, Pattern, plan};

const HOUR: i64 = 3600;
const DAY: i64 = 86_400;

/// A temporary tree with files of chosen ages, relative to a fixed now.
struct Tree {
    dir: tempfile::TempDir,
    now_secs: i64,
}

impl Tree {
    fn new() -> Tree {
        let now_secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        Tree { dir: tempfile::tempdir().unwrap(), now_secs }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    /// A file `age_secs` old (parents created).
    fn file(&self, relative: &str, age_secs: i64) {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"data").unwrap();
        self.set_age(relative, age_secs);
    }

    fn set_age(&self, relative: &str, age_secs: i64) {
        let at = UNIX_EPOCH + Duration::from_secs((self.now_secs - age_secs) as u64);
        std::fs::File::open(self.path(relative)).unwrap().set_modified(at).unwrap();
    }

    fn dir(&self, relative: &str) {
        std::fs::create_dir_all(self.path(relative)).unwrap();
    }

    fn link(&self, relative: &str, target: &str) {
        std::os::unix::fs::symlink(target, self.path(relative)).unwrap();
    }

    fn run(&self, lines: &[(&str, &str, &str)], delete_dirs: bool, excludes: &str) -> Vec<Report> {
        let jobs: Vec<Job> = lines
            .iter()
            .map(|(directory, age, pattern)| Job {
                directory: self.path(directory),
                age: Age::parse(age).unwrap(),
                pattern: Pattern::new(pattern).unwrap(),
                origin: "test".into(),
            })
            .collect();
        let options = Options {
            delete_dirs,
            excludes: Excludes::parse(excludes.as_bytes(), self.dir.path()),
            sentinel: false,
            now_secs: self.now_secs,
        };
        scour(&jobs, &options, 4).unwrap()
    }

    /// What is left under the temporary directory: `f path`, `d path`, `l path -> target`.
    fn survivors(&self) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        walk(self.dir.path(), self.dir.path(), &mut found);
        found
    }
}

fn walk(base: &Path, dir: &Path, found: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let relative = path.strip_prefix(base).unwrap().display().to_string();
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            found.insert(format!("l {relative} -> {}", std::fs::read_link(&path).unwrap().display()));
        } else if kind.is_dir() {
            found.insert(format!("d {relative}"));
            walk(base, &path, found);
        } else {
            found.insert(format!("f {relative}"));
        }
    }
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|item| item.to_string()).collect()
}

#[test]
fn old_matching_files_go_everywhere_under_the_directory_and_nothing_else() {
    let tree = Tree::new();
    for old in ["top/a.nc", "top/.hidden.nc", "top/sub/deep/b.nc", "top/old.txt", "top/sp ace.nc"] {
        tree.file(old, 3 * DAY);
    }
    for new in ["top/new.nc", "top/sub/new.nc", "top/sub/deep/new.txt"] {
        tree.file(new, HOUR);
    }
    let reports = tree.run(&[("top", "2", "*.nc")], false, "");
    assert_eq!(reports[0].outcome, Outcome::Scoured);
    assert_eq!(reports[0].counts.files_deleted, 4);
    assert_eq!(reports[0].counts.bytes_deleted, 16);
    assert_eq!(
        tree.survivors(),
        set(&[
            "d top",
            "d top/sub",
            "d top/sub/deep",
            "f top/new.nc",
            "f top/old.txt",
            "f top/sub/deep/new.txt",
            "f top/sub/new.nc"
        ])
    );
}

#[test]
fn the_cutoff_is_inclusive_to_the_second() {
    let tree = Tree::new();
    tree.file("top/exactly", 2 * DAY);
    tree.file("top/a_second_less", 2 * DAY - 1);
    tree.file("top/hours_exactly", 6 * HOUR + 30 * 60);
    tree.file("top/hours_less", 6 * HOUR + 30 * 60 - 1);
    tree.run(&[("top", "2", "exactly"), ("top", "2", "a_second_less"), ("top", "-06:30", "hours_*")], false, "");
    assert_eq!(tree.survivors(), set(&["d top", "f top/a_second_less", "f top/hours_less"]));
}

#[test]
fn entries_on_one_directory_add_up() {
    let tree = Tree::new();
    tree.file("top/grid_eta.nc", 30 * HOUR);
    tree.file("top/grid_gfs.nc", 30 * HOUR);
    tree.file("top/grid_gfs_old.nc", 3 * DAY);
    tree.run(&[("top", "2", "*"), ("top", "1", "*eta.nc")], false, "");
    assert_eq!(tree.survivors(), set(&["d top", "f top/grid_gfs.nc"]));
}

#[test]
fn symbolic_links_are_judged_by_their_targets_and_never_followed() {
    let tree = Tree::new();
    let outside = tree.path("outside");
    for (file, age) in [("outside/old.txt", 3 * DAY), ("outside/new.nc", HOUR), ("outside/dir_old/x.nc", 3 * DAY)] {
        tree.file(file, age);
    }
    tree.file("outside/dir_new/y.nc", 3 * DAY);
    tree.dir("outside/empty_old");
    tree.set_age("outside/dir_old", 3 * DAY);
    tree.set_age("outside/empty_old", 3 * DAY);
    tree.dir("top");
    let target = |name: &str| outside.join(name).display().to_string();
    tree.link("top/to_old_file.dat", &target("old.txt")); // any name: removed with its target
    tree.link("top/to_new_file.nc", &target("new.nc"));
    tree.link("top/broken.nc", &target("absent"));
    tree.link("top/loop", "loop");
    tree.link("top/to_old_dir", &target("dir_old")); // not empty: kept, the link goes
    tree.link("top/to_empty_old_dir", &target("empty_old"));
    tree.link("top/to_new_dir", &target("dir_new")); // not followed: y.nc stays
    tree.file("top/rel_new.dat", HOUR);
    tree.link("top/to_rel_new", "rel_new.dat"); // resolved from the link's directory
    let reports = tree.run(&[("top", "2", "*.nc")], false, "");
    let counts = reports[0].counts;
    assert_eq!((counts.links_removed, counts.link_targets_removed), (5, 2));
    assert_eq!(
        tree.survivors(),
        set(&[
            "d outside",
            "d outside/dir_new",
            "d outside/dir_old",
            "f outside/dir_new/y.nc",
            "f outside/dir_old/x.nc",
            "f outside/new.nc",
            "d top",
            "f top/rel_new.dat",
            &format!("l top/to_new_dir -> {}", target("dir_new")),
            &format!("l top/to_new_file.nc -> {}", target("new.nc")),
            "l top/to_rel_new -> rel_new.dat",
        ])
    );
}

#[test]
fn delete_dirs_removes_what_is_or_becomes_empty_but_not_a_top_that_became_empty() {
    let tree = Tree::new();
    tree.file("top/chain/a/b/old", 3 * DAY);
    tree.file("top/keep/new", HOUR);
    tree.dir("top/empty");
    tree.file("becomes/old", 3 * DAY);
    tree.dir("was_empty");
    tree.dir("untouched/empty");
    tree.run(&[("top", "2", "*"), ("becomes", "2", "*"), ("was_empty", "2", "*")], true, "");
    assert_eq!(
        tree.survivors(),
        set(&["d becomes", "d top", "d top/keep", "f top/keep/new", "d untouched", "d untouched/empty"])
    );
    // Without -d, no directory goes.
    let tree = Tree::new();
    tree.file("top/chain/a/old", 3 * DAY);
    tree.dir("top/empty");
    tree.run(&[("top", "2", "*")], false, "");
    assert_eq!(tree.survivors(), set(&["d top", "d top/chain", "d top/chain/a", "d top/empty"]));
}

#[test]
fn a_top_that_is_a_link_is_scoured_through_and_unlinked_when_empty() {
    let tree = Tree::new();
    tree.file("real/sub/old", 3 * DAY);
    tree.file("real/new", HOUR);
    tree.link("via", &tree.path("real").display().to_string());
    tree.dir("empty_real");
    tree.link("via_empty", &tree.path("empty_real").display().to_string());
    tree.run(&[("via", "2", "*"), ("via_empty", "2", "*")], true, "");
    let via = format!("l via -> {}", tree.path("real").display());
    assert_eq!(tree.survivors(), set(&["d empty_real", "d real", "f real/new", &via]));
}

#[test]
fn excluded_directories_are_neither_scoured_nor_removed() {
    let tree = Tree::new();
    tree.file("top/skip/old", 3 * DAY);
    tree.file("top/other/old", 3 * DAY);
    tree.file("top/old", 3 * DAY);
    tree.file("excluded_top/old", 3 * DAY);
    let excludes = format!("{}/\ntop//skip\n", tree.path("excluded_top").display());
    let reports = tree.run(&[("top", "2", "*"), ("excluded_top", "2", "*")], true, &excludes);
    assert_eq!(reports[1].outcome, Outcome::Excluded);
    assert_eq!(
        tree.survivors(),
        set(&["d excluded_top", "f excluded_top/old", "d top", "d top/skip", "f top/skip/old"])
    );
}

#[test]
fn other_kinds_of_files_are_left_alone() {
    let tree = Tree::new();
    tree.dir("top");
    nix::unistd::mkfifo(&tree.path("top/fifo.nc"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    // Age 0: everything up to now is old, the FIFO too.
    let reports = tree.run(&[("top", "0", "*")], true, "");
    assert_eq!(reports[0].counts.errors, 0);
    assert_eq!(tree.survivors(), set(&["d top", "f top/fifo.nc"]));
}

#[test]
fn a_large_directory_is_split_among_tasks_and_scoured_whole() {
    let tree = Tree::new();
    tree.dir("top");
    for index in 0..3000 {
        tree.file(&format!("top/f{index:04}"), if index % 2 == 0 { 3 * DAY } else { HOUR });
    }
    let reports = tree.run(&[("top", "2", "f*")], false, "");
    assert_eq!(reports[0].counts.files_deleted, 1500);
    let left = tree.survivors();
    assert_eq!(left.len(), 1501);
    assert!(left.iter().filter(|item| item.starts_with("f ")).all(|item| item.ends_with(['1', '3', '5', '7', '9'])));
}

#[test]
fn a_directory_is_read_in_bounded_batches_and_deleting_meanwhile_skips_nothing() {
    use std::os::fd::AsFd;
    let tree = Tree::new();
    tree.dir("top/sub");
    for index in 0..1000 {
        tree.file(&format!("top/f{index:04}"), HOUR);
    }
    let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY;
    let mut dir = nix::dir::Dir::open(&tree.path("top"), flags, nix::sys::stat::Mode::empty()).unwrap();
    let fd = dir.as_fd().try_clone_to_owned().unwrap();
    let (mut seen, mut batches, mut errors) = (BTreeSet::new(), 0, 0);
    let empty = crate::walk::for_each_batch(&mut dir, fd.as_fd(), &tree.path("top"), 64, &mut errors, |batch| {
        assert!(batch.files.len() + batch.directories.len() <= 64);
        batches += 1;
        for name in &batch.files {
            // Each batch's files are deleted before the next is read, as the scour does.
            nix::unistd::unlinkat(fd.as_fd(), name.as_c_str(), nix::unistd::UnlinkatFlags::NoRemoveDir).unwrap();
            seen.insert(name.to_str().unwrap().to_owned());
        }
        seen.extend(batch.directories.iter().map(|name| name.to_str().unwrap().to_owned()));
        std::ops::ControlFlow::Continue(())
    });
    assert!(!empty && errors == 0);
    assert_eq!(seen.len(), 1001);
    assert!(batches >= 16, "{batches}");
    assert_eq!(tree.survivors(), set(&["d top", "d top/sub"]));
}

#[test]
fn the_sentinel_keeps_a_directory_where_nothing_new_arrived() {
    let tree = Tree::new();
    tree.file("top/old.nc", 3 * DAY);
    tree.file("top/new.nc", HOUR);
    let job = Job {
        directory: tree.path("top"),
        age: Age::parse("2").unwrap(),
        pattern: Pattern::new("*.nc").unwrap(),
        origin: "test".into(),
    };
    let options = Options { sentinel: true, now_secs: tree.now_secs, ..Options::default() };
    // No sentinel yet: scoured, and the sentinel made.
    assert_eq!(scour(std::slice::from_ref(&job), &options, 2).unwrap()[0].outcome, Outcome::Scoured);
    assert_eq!(tree.survivors(), set(&["d top", "f top/.scour*.nc", "f top/new.nc"]));
    // Nothing newer than the sentinel: nothing deleted, even what is old. Sentinels (of this
    // or another pattern) do not count as new files.
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(tree.path("top/.scour-another.nc"), b"").unwrap();
    tree.file("top/old2.nc", 3 * DAY);
    assert_eq!(scour(std::slice::from_ref(&job), &options, 2).unwrap()[0].outcome, Outcome::Stale);
    assert!(tree.path("top/old2.nc").exists());
    // A new matching file anywhere under it: scoured again.
    std::thread::sleep(Duration::from_millis(20));
    tree.dir("top/sub");
    std::fs::write(tree.path("top/sub/arrived.nc"), b"x").unwrap();
    assert_eq!(scour(std::slice::from_ref(&job), &options, 2).unwrap()[0].outcome, Outcome::Scoured);
    assert!(!tree.path("top/old2.nc").exists());
}

#[test]
fn a_plan_holds_the_good_entries_and_every_problem_by_line() {
    let tree = Tree::new();
    tree.dir("data/decoded");
    let resolver = Resolver { datadir: tree.path("data"), home: None };
    let text = b"decoded 2 *.nc\nabsent 2\ndecoded 3-\n~ 2\n";
    let plan = plan(text, Path::new("scour.conf"), &resolver);
    assert_eq!(plan.jobs.len(), 1);
    assert_eq!(plan.jobs[0].directory, tree.path("data/decoded"));
    assert_eq!(plan.jobs[0].origin, "scour.conf:1");
    let lines: Vec<usize> = plan.problems.iter().map(|problem| problem.line).collect();
    assert_eq!(lines, [2, 3, 4]);
    assert!(plan.problems[0].is_missing_directory());
    assert!(plan.problems[2].to_string().starts_with("scour.conf:4: \"~\" is a whole home directory"));
}
