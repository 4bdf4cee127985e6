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

/// A count with thousands separated by commas (`2,097,152`), as the messages write counts.
pub fn format_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1000), "1,000");
        assert_eq!(format_count(2_097_152), "2,097,152");
        assert_eq!(format_count(u64::MAX), "18,446,744,073,709,551,615");
    }

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
