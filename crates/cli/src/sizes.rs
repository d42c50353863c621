//! Byte sizes on the command line: plain bytes, LDM's decimal suffixes `K`, `M`, `G`, `T`
//! (10³ … 10¹², as `pqcreate` and the registry read them) and binary `KiB`, `MiB`, `GiB`, `TiB`.

/// Parses `500M`, `2G`, `64MiB`, `1000000`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let multiplier: u64 = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        "TIB" => 1 << 40,
        _ => return Err(format!("invalid size {text:?}: use bytes or a suffix K, M, G (10^3…) or KiB, MiB, GiB")),
    };
    let value: f64 = number.parse().map_err(|_| format!("invalid size {text:?}: expected a number such as 500M"))?;
    let bytes = value * multiplier as f64;
    if !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("invalid size {text:?}: out of range"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("500M"), Ok(500_000_000));
        assert_eq!(parse_size("2G"), Ok(2_000_000_000));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("1.5k"), Ok(1500));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-5M").is_err());
    }
}
