//! `ldm7 act --check`: a pqact.conf is read as the reference reads it, each entry printed as
//! understood, the first error reported with file:line (exit 1). The sample `pqact.conf` of a
//! reference build (its examples uncommented) parses when `LDM_REF_BIN` is set; skipped
//! otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ldm7_testkit::skip;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

fn check(conf: &Path) -> Output {
    Command::new(LDM7).arg("act").arg("--check").arg(conf).output().expect("run ldm7 act")
}

#[test]
fn a_valid_configuration_is_printed_entry_by_entry() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let conf = dir.path().join("pqact.conf");
    std::fs::write(
        &conf,
        "# surface data\n\
         IDS|DDPLUS\t^SAUS(..) (....)\n\
         \tFILE\t-overwrite -close\tsurface/US/\\2/\\1\n\
         \n\
         NEXRAD3\t^SDUS5. .... ([0-3][0-9])([0-2][0-9])\tPIPE -strip\n\
         \tdecoder -d (\\1:yyyy)\n\
         ANY\t^_ELSE_$\tNOOP\n",
    )
    .expect("write");
    let output = check(&conf);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 3, "{printed}");
    assert!(lines[0].contains("pqact.conf:2: feed IDS|DDPLUS") && lines[0].contains("FILE -overwrite -close"));
    assert!(lines[0].ends_with(r#""surface/US/\\2/\\1""#), "{}", lines[0]);
    assert!(lines[1].contains("pqact.conf:5:") && lines[1].contains("PIPE -strip"), "{}", lines[1]);
    assert!(lines[2].contains(r#"pattern "^_ELSE_$", NOOP"#), "{}", lines[2]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("3 entries in 1 file(s): valid"));
}

#[test]
fn an_error_names_the_file_and_line_and_exits_1() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let conf = dir.path().join("bad.conf");
    std::fs::write(&conf, "WMO\t^A\tNOOP\n# fine so far\nWMO\t^B\n\tFILE\t-bogus x\n").expect("write");
    let output = check(&conf);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.conf:3: FILE takes no option -bogus"), "{stderr}");
    let missing = check(&dir.path().join("absent.conf"));
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read the configuration"));
}

#[test]
fn the_reference_sample_parses_with_its_examples_uncommented() {
    let Some(bin) = std::env::var_os("LDM_REF_BIN").map(PathBuf::from) else {
        skip("LDM_REF_BIN is not set (a Unidata LDM 6.15 build's bin/, whose etc/ holds the sample pqact.conf)");
        return;
    };
    let sample = bin.parent().expect("bin/ has a parent").join("etc/pqact.conf");
    let text = std::fs::read_to_string(&sample).unwrap_or_else(|error| panic!("{}: {error}", sample.display()));
    // The sample's examples are commented out: an entry line is `#FEED<TAB>…`, its
    // continuations right after it `#<TAB>…` (the documentation above them is left alone).
    let mut uncommented = String::new();
    let mut in_example = false;
    for line in text.lines() {
        let example = match line.strip_prefix('#') {
            Some(rest)
                if rest.split('\t').nth(1).is_some() && rest.split('\t').next().is_some_and(is_feed_expression) =>
            {
                Some(rest)
            }
            Some(rest) if in_example && rest.starts_with('\t') => Some(rest),
            _ => None,
        };
        in_example = example.is_some();
        uncommented.push_str(example.unwrap_or(line));
        uncommented.push('\n');
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let conf = dir.path().join("pqact.conf");
    std::fs::write(&conf, &uncommented).expect("write");
    let output = check(&conf);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.lines().count() >= 5, "{printed}");
    assert!(printed.lines().all(|line| line.contains(" FILE ")), "{printed}");
}

fn is_feed_expression(text: &str) -> bool {
    !text.is_empty()
        && text.contains(|c: char| c.is_ascii_uppercase())
        && text.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || "|()-~".contains(c))
}
