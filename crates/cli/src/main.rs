//! The `ldm7` command.

fn main() {
    println!("ldm7");
}
