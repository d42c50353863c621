//! What the figures of `ldm7 bench compare` and `ldm7 plan` are drawn with: DejaVu Sans,
//! embedded in the binary, so that drawing one needs no system font.

/// DejaVu Sans (license: `assets/DejaVuSans-LICENSE.txt`).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Registers the embedded font as plotters' `sans-serif`.
pub fn register_font() -> anyhow::Result<()> {
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the embedded font could not be loaded"))
}
