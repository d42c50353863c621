//! `ldm7 scour` (and `scour`, the same binary under LDM's name) on generated trees: files of
//! several ages and patterns, nested and hidden files, empty directories, an excluded directory,
//! symbolic links. The survivors are checked against the list this test expects and, when
//! `LDM_REF_BIN` names an LDM 6.15 build's `bin/`, against what LDM's own `scour` leaves of an
//! identical copy (skipped otherwise). Only forms on which the two agree by design are used
//! here: ages in whole days, absolute link targets (docs/operations.md lists the differences).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use ldm7_testbed::bench::scour::{reference_command, reference_refused, survivors};
use ldm7_testkit::skip;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");
const HOUR: u64 = 3600;
const DAY: u64 = 86_400;

fn reference_bin() -> Option<PathBuf> {
    match std::env::var_os("LDM_REF_BIN") {
        Some(bin) if Path::new(&bin).join("scour").is_file() => Some(PathBuf::from(bin)),
        Some(bin) => {
            panic!("LDM_REF_BIN={} holds no scour: point it at an LDM 6.15 build's bin/", Path::new(&bin).display())
        }
        None => {
            skip("LDM_REF_BIN is not set (an LDM 6.15 build's bin/): the comparison with LDM's scour is skipped");
            None
        }
    }
}

/// A copy of the test tree under `root`, every age counted back from `now`.
struct Copy {
    root: PathBuf,
    now: SystemTime,
}

impl Copy {
    fn file(&self, relative: &str, age_secs: u64) {
        let path = self.root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"product").unwrap();
        self.age(relative, age_secs);
    }

    fn age(&self, relative: &str, age_secs: u64) {
        let file = std::fs::File::open(self.root.join(relative)).unwrap();
        file.set_modified(self.now - Duration::from_secs(age_secs)).unwrap();
    }

    fn link(&self, relative: &str, target: &str) {
        std::os::unix::fs::symlink(self.root.join(target), self.root.join(relative)).unwrap();
    }

    /// The tree: `tree/` is scoured by the configuration of [`Copy::config`], `outside/` holds
    /// the targets of links.
    fn build(&self) {
        for (file, age) in [
            ("tree/all/new1.txt", HOUR),
            ("tree/all/day47.txt", 47 * HOUR),
            ("tree/all/day49.txt", 49 * HOUR),
            ("tree/all/.hidden_old", 3 * DAY),
            ("tree/all/.hidden_new", HOUR),
            ("tree/all/sub/deep/old.bin", 10 * DAY),
            ("tree/all/sub/deep/new.bin", 23 * HOUR),
            ("tree/all/sub/becomes/old.bin", 3 * DAY),
            ("tree/all/excluded/old.bin", 3 * DAY),
            ("tree/nc/a.nc", 25 * HOUR),
            ("tree/nc/b.nc", 23 * HOUR),
            ("tree/nc/c.txt", 10 * DAY),
            ("tree/nc/.d.nc", 3 * DAY),
            ("tree/nc/sub/e.nc", 3 * DAY),
            ("tree/nc/sub/f.gif", 3 * DAY),
            ("tree/gif/abcde.gif", 3 * DAY),
            ("tree/gif/abcdef.gif", 3 * DAY),
            ("tree/gif/x.gif", 3 * DAY),
            ("tree/gif/fghij.gif", HOUR),
            ("outside/old_target.txt", 3 * DAY),
            ("outside/new_target.txt", HOUR),
            ("outside/dir/old.nc", 3 * DAY),
            ("outside/old_dir/keep.txt", HOUR),
        ] {
            self.file(file, age);
        }
        std::fs::create_dir_all(self.root.join("tree/all/empty")).unwrap();
        std::fs::create_dir_all(self.root.join("tree/links")).unwrap();
        self.age("outside/old_dir", 3 * DAY);
        self.link("tree/links/old.nc", "outside/old_target.txt"); // old target: both go
        self.link("tree/links/new.nc", "outside/new_target.txt");
        self.link("tree/links/broken", "outside/absent");
        self.link("tree/links/dir", "outside/dir"); // never followed: dir/old.nc stays
        self.link("tree/links/old_dir", "outside/old_dir"); // not empty: kept, the link goes
    }

    /// scour.conf and the excludes file for this copy (absolute directories).
    fn config(&self) -> (PathBuf, PathBuf) {
        let tree = self.root.join("tree");
        let t = tree.display();
        let config = self.root.join("scour.conf");
        let text = format!(
            "# Directory  Days-old  Optional-filename-pattern\n\n{t}/all 2\n{t}/nc\t1\t*.nc\n{t}/gif 2 ?????.gif\n{t}/links 2 *.nc\n"
        );
        std::fs::write(&config, text).unwrap();
        let excludes = self.root.join("excludes");
        std::fs::write(&excludes, format!("{t}/all/excluded\n")).unwrap();
        (config, excludes)
    }

    /// What is left, with this copy's root written ROOT in link targets.
    fn survivors(&self) -> Vec<String> {
        let root = self.root.display().to_string();
        survivors(&self.root).unwrap().into_iter().map(|item| item.replace(&root, "ROOT")).collect()
    }
}

const EXPECTED: &[&str] = &[
    "d outside",
    "d outside/dir",
    "d outside/old_dir",
    "d tree",
    "d tree/all",
    "d tree/all/excluded",
    "d tree/all/sub",
    "d tree/all/sub/deep",
    "d tree/gif",
    "d tree/links",
    "d tree/nc",
    "d tree/nc/sub",
    "f excludes",
    "f outside/dir/old.nc",
    "f outside/new_target.txt",
    "f outside/old_dir/keep.txt",
    "f scour.conf",
    "f tree/all/.hidden_new",
    "f tree/all/day47.txt",
    "f tree/all/excluded/old.bin",
    "f tree/all/new1.txt",
    "f tree/all/sub/deep/new.bin",
    "f tree/gif/abcdef.gif",
    "f tree/gif/fghij.gif",
    "f tree/gif/x.gif",
    "f tree/nc/b.nc",
    "f tree/nc/c.txt",
    "f tree/nc/sub/f.gif",
    "l tree/links/dir -> ROOT/outside/dir",
    "l tree/links/new.nc -> ROOT/outside/new_target.txt",
];

fn output(mut command: Command) -> Output {
    command.stdin(Stdio::null()).output().expect("run")
}

fn ldm7_scour(args: &[&str], config: &Path) -> Output {
    let mut command = Command::new(LDM7);
    command.arg("scour").args(args).arg(config);
    output(command)
}

#[test]
fn survivors_are_those_ldm_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let ours = Copy { root: dir.path().join("ours"), now };
    ours.build();
    let (config, excludes) = ours.config();
    let run = ldm7_scour(&["-d", "-e", excludes.to_str().unwrap(), "-l", "-"], &config);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(ours.survivors(), EXPECTED, "ldm7 scour");
    let Some(bin) = reference_bin() else { return };
    let theirs = Copy { root: dir.path().join("theirs"), now };
    theirs.build();
    let (config, excludes) = theirs.config();
    let mut command = reference_command(&bin);
    command.args(["-d", "-e"]).arg(&excludes).args(["-l", "-"]).arg(&config);
    let run = output(command);
    let log = String::from_utf8_lossy(&run.stderr);
    if let Some(reason) = reference_refused(&log) {
        skip(&reason);
        return;
    }
    assert!(run.status.success(), "LDM's scour: {log}");
    assert_eq!(theirs.survivors(), EXPECTED, "LDM's scour, log:\n{log}");
}

#[test]
fn bad_lines_are_errors_with_file_and_line_and_the_other_lines_run() {
    let dir = tempfile::tempdir().unwrap();
    let copy = Copy { root: dir.path().to_path_buf(), now: SystemTime::now() };
    copy.file("data/old.nc", 3 * DAY);
    copy.file("data/new.nc", HOUR);
    let data = dir.path().join("data");
    let config = dir.path().join("scour.conf");
    let text = format!("{d} 3-\n{d}\n{d} 2 *.nc\n{d}/absent 2\n{d} 2-113055\n", d = data.display());
    std::fs::write(&config, text).unwrap();
    let run = ldm7_scour(&[], &config);
    let log = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{log}");
    let config_name = config.display();
    for (line, level) in [(1, "ERROR"), (2, "ERROR"), (4, "WARN"), (5, "ERROR")] {
        let wanted = format!("{level} {config_name}:{line}: ");
        assert!(log.contains(&wanted), "no {wanted:?} in:\n{log}");
    }
    assert!(!data.join("old.nc").exists() && data.join("new.nc").exists());
    // LDM exits 0 too (it logs such lines and goes on).
    let Some(bin) = reference_bin() else { return };
    copy.file("data/old.nc", 3 * DAY);
    let mut command = reference_command(&bin);
    command.arg(&config);
    let run = output(command);
    if let Some(reason) = reference_refused(&String::from_utf8_lossy(&run.stderr)) {
        skip(&reason);
        return;
    }
    assert_eq!(run.status.code(), Some(0));
    assert!(!data.join("old.nc").exists());
}

#[test]
fn a_configuration_that_cannot_be_read_exits_1_as_ldms() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent.conf");
    let run = ldm7_scour(&[], &absent);
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("cannot read the scour configuration"));
    // No argument: etc/scour.conf under the current directory.
    let mut command = Command::new(LDM7);
    command.arg("scour").current_dir(dir.path());
    let run = output(command);
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("etc/scour.conf"));
    let Some(bin) = reference_bin() else { return };
    let mut command = reference_command(&bin);
    command.arg(&absent);
    assert_eq!(output(command).status.code(), Some(1));
}

#[test]
fn check_prints_the_entries_and_fails_on_a_problem_without_deleting() {
    let dir = tempfile::tempdir().unwrap();
    let copy = Copy { root: dir.path().to_path_buf(), now: SystemTime::now() };
    copy.file("data/decoded/old.nc", 3 * DAY);
    let config = dir.path().join("scour.conf");
    std::fs::write(&config, "decoded 1-12 *.nc\n").unwrap();
    let datadir = dir.path().join("data");
    let datadir_arg = datadir.to_str().unwrap();
    let run = ldm7_scour(&["--check", "--datadir", datadir_arg], &config);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let printed = String::from_utf8_lossy(&run.stdout);
    let wanted =
        format!("{}:1: {}  older than 1 day 12:00  matching *.nc", config.display(), datadir.join("decoded").display());
    assert!(printed.contains(&wanted), "{printed}");
    std::fs::write(&config, "decoded 1-12 *.nc\ndecoded 12:00\n").unwrap();
    let run = ldm7_scour(&["--check", "--datadir", datadir_arg], &config);
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains(&format!("{}:2: age \"12:00\"", config.display())));
    assert!(datadir.join("decoded/old.nc").exists());
}

#[test]
fn invoked_as_scour_it_takes_ldms_flags_and_logs_as_scour() {
    let dir = tempfile::tempdir().unwrap();
    let copy = Copy { root: dir.path().to_path_buf(), now: SystemTime::now() };
    copy.file("data/old.nc", 3 * DAY);
    copy.file("data/sub/old.nc", 3 * DAY);
    let scour = dir.path().join("scour");
    std::os::unix::fs::symlink(LDM7, &scour).unwrap();
    let config = dir.path().join("scour.conf");
    std::fs::write(&config, format!("{} 2\n", dir.path().join("data").display())).unwrap();
    let log = dir.path().join("scour.log");
    let mut command = Command::new(&scour);
    command.args(["-d", "-v", "-l"]).arg(&log).arg(&config);
    let run = output(command);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(" scour["), "{text}");
    assert!(text.contains(&format!("INFO deleted {}", dir.path().join("data/sub/old.nc").display())), "{text}");
    assert!(
        text.contains(&format!("INFO removed empty directory {}", dir.path().join("data/sub").display())),
        "{text}"
    );
    assert!(!dir.path().join("data/sub").exists() && dir.path().join("data").exists());
    // Without -v: no INFO lines.
    copy.file("data/old.nc", 3 * DAY);
    let mut command = Command::new(&scour);
    command.arg(&config);
    let run = output(command);
    assert!(run.status.success() && run.stderr.is_empty(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(!dir.path().join("data/old.nc").exists());
}

/// The benchmark, tiny, so that it never rots (with LDM's scour beside it when `LDM_REF_BIN`
/// is set).
#[test]
fn the_scour_benchmark_runs_tiny() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(LDM7);
    command.args(["bench", "scour", "--files", "300", "--dirs", "7", "--repeat", "1", "--dir"]).arg(dir.path());
    let run = output(command);
    let printed = String::from_utf8_lossy(&run.stdout);
    let errors = String::from_utf8_lossy(&run.stderr);
    if let Some(reason) = reference_refused(&errors) {
        skip(&reason);
        return;
    }
    assert!(run.status.success(), "{printed}{errors}");
    assert!(printed.contains("300 files in 7 directories (identical survivors)"), "{printed}");
    // The 150 new files and 8 directories (7 leaves, 1 above them).
    assert!(printed.contains("158 survivors as expected"), "{printed}");
}
