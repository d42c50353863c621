//! Reading product-metadata traces from files (the format: [`ldm7_types::trace`]): what
//! `ldm7 insert --replay`, `ldm7 plan`, `ldm7 trace` and the demo read.

use std::path::Path;

use ldm7_types::trace::TraceProduct;

/// Reads and parses a whole trace; errors name `file:line`.
pub fn read_trace(path: &Path) -> Result<Vec<TraceProduct>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read trace {}: {error}: check the path", path.display()))?;
    let products = ldm7_types::trace::parse_trace(&text).map_err(|error| format!("{}:{error}", path.display()))?;
    if products.is_empty() {
        return Err(format!("trace {} holds no products", path.display()));
    }
    Ok(products)
}

/// Keeps the products of the trace's first `span` (of trace time, from its first product).
pub fn keep_span(products: &mut Vec<TraceProduct>, span: std::time::Duration) {
    let Some(first) = products.first().map(|product| product.created) else { return };
    let end = first.as_unix_micros().saturating_add(i64::try_from(span.as_micros()).unwrap_or(i64::MAX));
    products.retain(|product| product.created.as_unix_micros() < end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.txt");
        std::fs::write(&path, "1 20150615000000.009\nabc 20150615000000.009\n").expect("write");
        let error = read_trace(&path).unwrap_err();
        assert!(
            error.ends_with("t.txt:2: size \"abc\" is not a byte count (expected `SIZE YYYYMMDDhhmmss.fff`)"),
            "{error}"
        );
        std::fs::write(&path, "# nothing\n").expect("write");
        assert!(read_trace(&path).unwrap_err().contains("holds no products"));
    }
}
