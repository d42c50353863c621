//! Every flag that takes a quantity (a duration, a size, a speed, an address, a count) parses
//! into a typed value or is refused with what was expected and exit code 1: the real binary, with
//! `inf`, `nan`, negative and garbage values.

use std::process::Command;

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

/// Runs `ldm7 args…` (or the binary under a classic name) and returns its standard error,
/// asserting exit code 1 and nothing started.
fn refused(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).env_remove("LDM7_QUEUE").output().expect("run ldm7");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{program} {args:?} must be refused with exit 1: {stderr}");
    assert!(output.stdout.is_empty(), "{program} {args:?} printed {:?}", String::from_utf8_lossy(&output.stdout));
    stderr
}

/// Each value of `values` given to `flag` of `command` is refused, and the message names the
/// value and says what is expected (`expected` is part of it).
fn each_refused(command: &[&str], flag: &str, values: &[&str], expected: &str) {
    for value in values {
        let mut args = command.to_vec();
        let pair = format!("{flag}={value}");
        args.push(&pair);
        let stderr = refused(LDM7, &args);
        assert!(stderr.contains("invalid value"), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?} should say {expected:?}: {stderr}");
    }
}

const NOT_DURATIONS: &[&str] = &["inf", "nan", "-1", "-0.5", "1e400", "soon", "5 parsecs", ""];

#[test]
fn durations_that_are_not_durations_are_refused() {
    let expected = "expected a duration";
    each_refused(&["notify"], "--timeout", NOT_DURATIONS, expected);
    each_refused(&["notify"], "--offset", NOT_DURATIONS, expected);
    each_refused(&["watch"], "--timeout", NOT_DURATIONS, expected);
    each_refused(&["watch"], "--offset", NOT_DURATIONS, expected);
    each_refused(&["cat"], "--offset", NOT_DURATIONS, expected);
    each_refused(&["serve"], "--retry-max", NOT_DURATIONS, expected);
    each_refused(&["serve"], "--time-offset", NOT_DURATIONS, expected);
    each_refused(&["serve"], "--max-latency", NOT_DURATIONS, expected);
    // Short flags too, as LDM's users type them.
    let stderr = refused(LDM7, &["notify", "-T", "inf"]);
    assert!(stderr.contains("\"inf\"") && stderr.contains(expected), "{stderr}");
    let stderr = refused(LDM7, &["serve", "-o", "nan"]);
    assert!(stderr.contains(expected), "{stderr}");
    let stderr = refused(LDM7, &["serve", "-m", "x"]);
    assert!(stderr.contains(expected), "{stderr}");
}

#[test]
fn durations_out_of_their_range_are_refused() {
    each_refused(&["notify"], "--timeout", &["0", "0s"], "above 0");
    each_refused(&["serve"], "--retry-max", &["0", "1ms", "0.001"], "at least 10ms");
}

#[test]
fn sizes_counts_speeds_and_addresses_are_checked() {
    each_refused(&["queue", "info"], "--log-max-size", &["inf", "nan", "-1", "0", "12X", "big"], "expected a size");
    each_refused(&["queue", "info"], "--log-keep", &["-1", "1001"], "is not in 0..=1000");
    each_refused(&["queue", "info"], "--log-keep", &["many", "1.5"], "invalid digit");
    each_refused(&["serve"], "--max-clients", &["0"], "0 is not in 1..");
    each_refused(&["serve"], "--max-clients", &["-1", "lots"], "invalid");
    each_refused(&["insert", "--replay", "trace.txt"], "--speed", &["inf", "nan", "-1", "fast"], "give 0");
    each_refused(&["demo"], "--speed", &["inf", "nan", "-2"], "give 0");
    each_refused(&["notify"], "--host", &["host:0", "host:70000", "host:x", ":388", ""], "HOST[:PORT]");
    each_refused(&["send", "file"], "--host", &["host:99999"], "HOST[:PORT]");
}

#[test]
fn classic_names_refuse_the_same_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, args) in [("notifyme", ["-T", "nan"]), ("ldmd", ["--retry-max", "inf"])] {
        let link = dir.path().join(name);
        std::os::unix::fs::symlink(LDM7, &link).expect("symlink");
        let stderr = refused(link.to_str().expect("utf-8"), &args);
        assert!(stderr.contains("expected a duration"), "{name}: {stderr}");
    }
}

/// No option's help says its default twice (clap prints `[default: …]` for a flag with a
/// default value; a doc text that also says `[default: …]` doubles it): every subcommand's help.
#[test]
fn no_help_text_repeats_its_default() {
    let mut pending = vec![Vec::<String>::new()];
    let mut checked = 0;
    while let Some(path) = pending.pop() {
        let output = Command::new(LDM7).args(&path).arg("--help").output().expect("run ldm7 --help");
        let help = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "ldm7 {path:?} --help: {help}");
        checked += 1;
        let mut section = "";
        let mut entries: Vec<String> = Vec::new();
        for line in help.lines() {
            if !line.starts_with(' ') {
                section = line;
                continue;
            }
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            if section == "Commands:" && indent == 2 {
                let name = trimmed.split_whitespace().next().unwrap_or("");
                if name != "help" {
                    pending.push(path.iter().cloned().chain([name.to_owned()]).collect());
                }
            } else if indent <= 6 && trimmed.starts_with('-') {
                entries.push(trimmed.to_owned());
            } else if let Some(entry) = entries.last_mut() {
                entry.push(' ');
                entry.push_str(trimmed);
            }
        }
        for entry in entries {
            assert!(entry.matches("[default").count() <= 1, "ldm7 {path:?}: the default is said twice: {entry}");
        }
    }
    assert!(checked > 20, "every subcommand's help was read ({checked})");
}
