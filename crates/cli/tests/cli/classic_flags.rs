//! The flags of LDM's programs that ldm7 answers under their names (issue #39): pqinsert `-n
//! -r`, pqcat `-c -s`, pqmon `-S -i`, pqcheck `-F`, notifyme `-P -t`, ldmd's positional
//! configuration and `-n -t -M`, each through a link named after the program.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{LOCAL, Node};

const LDM7: &str = env!("CARGO_BIN_EXE_ldm7");

/// Runs `program` (a link to ldm7 in `bin`) with `args`.
fn classic(bin: &Path, program: &str, args: &[&str]) -> Output {
    let link = bin.join(program);
    if !link.exists() {
        std::os::unix::fs::symlink(LDM7, &link).expect("link");
    }
    Command::new(link).args(args).env_remove("LDM7_QUEUE").env_remove("LDM7_SETTINGS").output().expect("run")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn ldm_programs_take_their_classic_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path();
    let queue = dir.path().join("q.pq").display().to_string();
    assert!(classic(bin, "pqcreate", &["-q", &queue, "-s", "4M"]).status.success());
    let file = dir.path().join("product.txt");
    std::fs::write(&file, "a product\n").expect("write");
    let file = file.display().to_string();

    // pqinsert -n (a size guess) and -r (read, don't map): accepted.
    let output = classic(bin, "pqinsert", &["-n", "100", "-r", "-q", &queue, &file]);
    assert!(output.status.success(), "{}", text(&output));
    // A product whose signature is its identifier's MD5 (-i): pqcat -c reports it, exit 1.
    let output = classic(bin, "pqinsert", &["-i", "-p", "signed-by-ident", "-q", &queue, &file]);
    assert!(output.status.success(), "{}", text(&output));
    let output = classic(bin, "pqcat", &["-c", "-q", &queue]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(text(&output).contains("do not match its signature") && text(&output).contains("signed-by-ident"));
    let output = classic(bin, "pqcat", &["-c", "-s", "-p", "product", "-q", &queue]);
    assert!(output.status.success(), "pqcat -c -s of products whose data match: {}", text(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "a product\n");

    // pqmon -S: the size parameters ldmadmin reads, on one line.
    let output = classic(bin, "pqmon", &["-S", "-q", &queue]);
    assert!(output.status.success(), "{}", text(&output));
    let fields: Vec<String> = String::from_utf8_lossy(&output.stdout).split_whitespace().map(str::to_owned).collect();
    assert_eq!(fields.len(), 12, "{fields:?}");
    assert_eq!((fields[0].as_str(), fields[1].as_str(), fields[6].as_str()), ("0", "4000000", "2"), "{fields:?}");
    assert_eq!(fields[9], "-1", "no minimum residence time before any eviction: {fields:?}");
    // pqcheck -F: accepted.
    let output = classic(bin, "pqcheck", &["-F", "-q", &queue]);
    assert!(output.status.success(), "{}", text(&output));

    // ldmd -n CONF (positional): checks and exits; -t and -M accepted.
    let conf = dir.path().join("ldmd.conf");
    std::fs::write(&conf, format!("ALLOW ANY {LOCAL}\n")).expect("conf");
    let output = classic(bin, "ldmd", &["-n", "-t", "25", "-M", "32", "-q", &queue, &conf.display().to_string()]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("ldmd.conf: OK"), "{}", text(&output));

    // notifyme -P PORT -t TIMEOUT against a server.
    let mut node = Node::new(dir.path(), "node", "4M", &format!("ALLOW ANY {LOCAL}\n"));
    node.start();
    let port = node.port.to_string();
    let output = classic(bin, "notifyme", &["-h", "127.0.0.1", "-P", &port, "-t", "5", "-T", "0.5"]);
    assert!(output.status.success(), "{}", text(&output));
    node.stop();
}
