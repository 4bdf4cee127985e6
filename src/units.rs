//! Sizes as PyTorch prints them, for every message that names a size: at the bottom of the
//! layers, so that reading a file can say how large it may be.

/// PyTorch's `format_size`: bytes up to 1 KiB, then KiB, MiB, GiB with two decimals.
pub fn format_size(size: u64) -> String {
    const KIB: f64 = 1024.0;
    let s = size as f64;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1 << 20 {
        format!("{:.2} KiB", s / KIB)
    } else if size <= 1 << 30 {
        format!("{:.2} MiB", s / KIB / KIB)
    } else {
        format!("{:.2} GiB", s / KIB / KIB / KIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_matches_pytorch() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size((20 << 20) + 1), "20.00 MiB");
        assert_eq!(format_size(80 << 30), "80.00 GiB");
        assert_eq!(format_size(1 << 30), "1024.00 MiB");
    }
}
