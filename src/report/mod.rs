//! What a PyTorch user reads: `memory_stats()` with PyTorch's exact keys and `memory_summary()`
//! with PyTorch's exact table (reference sections 2 and 3).

use crate::alloc::{DeviceStats, Stat, StatType};
use std::collections::BTreeMap;

/// `torch.cuda.memory_stats()`: flattened dotted keys, sorted, as Python's OrderedDict has them.
pub fn memory_stats(stats: &DeviceStats) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let mut put_stat = |prefix: String, s: &Stat| {
        out.insert(format!("{prefix}.current"), s.current);
        out.insert(format!("{prefix}.peak"), s.peak);
        out.insert(format!("{prefix}.allocated"), s.allocated);
        out.insert(format!("{prefix}.freed"), s.freed);
    };
    for (name, array) in stats.arrays() {
        for t in StatType::ALL {
            put_stat(format!("{name}.{}", t.key()), array.get(t));
        }
    }
    put_stat("oversize_allocations".into(), &stats.oversize_allocations);
    put_stat("oversize_segments".into(), &stats.oversize_segments);
    for (key, value) in [
        ("num_alloc_retries", stats.num_alloc_retries),
        ("num_ooms", stats.num_ooms),
        ("num_sync_all_streams", stats.num_sync_all_streams),
        ("num_device_alloc", stats.num_device_alloc),
        ("num_device_free", stats.num_device_free),
        ("max_split_size", stats.max_split_size),
    ] {
        out.insert(key.into(), value);
    }
    out
}

/// `torch.cuda.memory_summary(device, abbreviated)`, byte for byte.
pub fn memory_summary(stats: &DeviceStats, device: i64, abbreviated: bool) -> String {
    let rule = |c: char| c.to_string().repeat(75);
    let mut lines: Vec<String> = vec![
        rule('='),
        format!("{:18}PyTorch CUDA memory summary, device ID {:<17} ", "", device),
        rule('-'),
        format!("{:12}CUDA OOMs: {:<12} | {:7}cudaMalloc retries: {:<8}  ", "", stats.num_ooms, "", stats.num_alloc_retries),
        rule('='),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".into(),
    ];
    // (memory_stats key, row title, how to format a value)
    type Metric = (&'static str, &'static str, fn(i64, i64) -> String);
    let metrics: [Metric; 9] = [
        ("allocated_bytes", "Allocated memory", format_bytes),
        ("active_bytes", "Active memory", format_bytes),
        ("requested_bytes", "Requested memory", format_bytes),
        ("reserved_bytes", "GPU reserved memory", format_bytes),
        ("inactive_split_bytes", "Non-releasable memory", format_bytes),
        ("allocation", "Allocations", format_count),
        ("active", "Active allocs", format_count),
        ("segment", "GPU reserved segments", format_count),
        ("inactive_split", "Non-releasable allocs", format_count),
    ];
    let arrays: BTreeMap<&str, _> = stats.arrays().into_iter().collect();
    for (key, label, formatter) in metrics {
        lines.push(rule('-'));
        let array = arrays[key];
        let all = array.get(StatType::All);
        let rows: &[(StatType, &str)] = if abbreviated {
            &[(StatType::All, label)]
        } else {
            &[(StatType::All, label), (StatType::LargePool, "      from large pool"), (StatType::SmallPool, "      from small pool")]
        };
        for &(t, name) in rows {
            // Units follow the `all` row's value in each column.
            lines.push(row(name, array.get(t), all, formatter));
        }
    }
    for (label, stat) in [("Oversize allocations", &stats.oversize_allocations), ("Oversize GPU segments", &stats.oversize_segments)] {
        lines.push(rule('-'));
        lines.push(row(label, stat, stat, format_count));
    }
    lines.push(rule('='));
    let mut out = String::new();
    for line in lines {
        out.push('|');
        out.push_str(&line);
        out.push_str("|\n");
    }
    out
}

fn row(label: &str, s: &Stat, reference: &Stat, f: fn(i64, i64) -> String) -> String {
    format!(
        " {:<21} | {} | {} | {} | {} ",
        label,
        f(s.current, reference.current),
        f(s.peak, reference.peak),
        f(s.allocated, reference.allocated),
        f(s.freed, reference.freed)
    )
}

/// A bytes cell: 6-wide integer and a 3-character unit, stepping up while the reference is at
/// least 768 of the current unit.
fn format_bytes(value: i64, reference: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (mut value, mut reference) = (value, reference);
    let mut unit = 0;
    while reference >= 768 * 1024 && unit + 1 < UNITS.len() {
        reference /= 1024;
        value /= 1024;
        unit += 1;
    }
    format!("{value:>6} {}", UNITS[unit])
}

/// A count cell: 7-wide integer and a 1-character suffix, stepping while reference >= 750,000.
fn format_count(value: i64, reference: i64) -> String {
    const SUFFIX: [&str; 3] = [" ", "K", "M"];
    let (mut value, mut reference) = (value, reference);
    let mut unit = 0;
    while reference >= 750_000 && unit + 1 < SUFFIX.len() {
        reference /= 1000;
        value /= 1000;
        unit += 1;
    }
    format!("{value:>7} {} ", SUFFIX[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::StatArray;

    const MIB: i64 = 1 << 20;

    fn stat(current: i64, peak: i64, allocated: i64, freed: i64) -> Stat {
        Stat { current, peak, allocated, freed }
    }

    /// The reference's example rows, rebuilt from the rules.
    fn example() -> DeviceStats {
        let mut s = DeviceStats { num_alloc_retries: 2, max_split_size: -1, ..Default::default() };
        s.allocated_bytes = StatArray([
            stat(1500 * MIB, 3000 * MIB, 90000 * MIB, 88500 * MIB),
            stat(10 * MIB, 12 * MIB, 1000 * MIB, 990 * MIB),
            stat(1490 * MIB, 2990 * MIB, 89000 * MIB, 87510 * MIB),
        ]);
        s.inactive_split_bytes = StatArray([
            stat(600 * MIB, 900 * MIB, 50000 * MIB, 49400 * MIB),
            stat(4 * MIB, 5 * MIB, 1000 * MIB, 996 * MIB),
            stat(596 * MIB, 895 * MIB, 49000 * MIB, 48404 * MIB),
        ]);
        s.allocation = StatArray([stat(420, 900, 1_200_000, 1_199_580), stat(300, 600, 1_000_000, 999_700), stat(120, 300, 200_000, 199_880)]);
        s
    }

    #[test]
    fn summary_rows_match_the_reference_layout() {
        let text = memory_summary(&example(), 0, false);
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines {
            assert_eq!(line.chars().count(), 77, "{line:?}");
        }
        assert!(text.ends_with("|\n"));
        assert_eq!(lines[0], format!("|{}|", "=".repeat(75)));
        assert_eq!(lines[1], "|                  PyTorch CUDA memory summary, device ID 0                 |");
        assert_eq!(lines[3], "|            CUDA OOMs: 0            |        cudaMalloc retries: 2         |");
        assert_eq!(lines[5], "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |");
        let find = |label: &str| lines.iter().position(|l| l.starts_with(&format!("| {label}"))).unwrap();
        let a = find("Allocated memory");
        assert_eq!(lines[a], "| Allocated memory      |   1500 MiB |   3000 MiB |  90000 MiB |  88500 MiB |");
        assert_eq!(lines[a + 1], "|       from large pool |   1490 MiB |   2990 MiB |  89000 MiB |  87510 MiB |");
        assert_eq!(lines[a + 2], "|       from small pool |     10 MiB |     12 MiB |   1000 MiB |    990 MiB |");
        let n = find("Non-releasable memory");
        assert_eq!(lines[n], "| Non-releasable memory | 614400 KiB |    900 MiB |  50000 MiB |  49400 MiB |");
        assert_eq!(lines[n + 1], "|       from large pool | 610304 KiB |    895 MiB |  49000 MiB |  48404 MiB |");
        assert_eq!(lines[n + 2], "|       from small pool |   4096 KiB |      5 MiB |   1000 MiB |    996 MiB |");
        let c = find("Allocations");
        assert_eq!(lines[c], "| Allocations           |     420    |     900    |    1200 K  |    1199 K  |");
        assert_eq!(lines[c + 1], "|       from large pool |     120    |     300    |     200 K  |     199 K  |");
        assert_eq!(lines[c + 2], "|       from small pool |     300    |     600    |    1000 K  |     999 K  |");
        let o = find("Oversize allocations");
        assert_eq!(lines[o], "| Oversize allocations  |       0    |       0    |       0    |       0    |");
        assert_eq!(lines[o + 2], "| Oversize GPU segments |       0    |       0    |       0    |       0    |");
        assert_eq!(lines.len(), 6 + 9 * 4 + 4 + 1);
        let labels: Vec<&str> = lines.iter().filter(|l| !l.starts_with("|       from") && l.contains(" | ")).map(|l| l[2..23].trim()).collect();
        assert_eq!(
            labels[2..],
            [
                "Allocated memory",
                "Active memory",
                "Requested memory",
                "GPU reserved memory",
                "Non-releasable memory",
                "Allocations",
                "Active allocs",
                "GPU reserved segments",
                "Non-releasable allocs",
                "Oversize allocations",
                "Oversize GPU segments"
            ]
        );
    }

    #[test]
    fn abbreviated_summary_has_no_pool_rows() {
        let text = memory_summary(&example(), 3, true);
        assert!(!text.contains("from large pool"));
        assert!(text.contains("device ID 3  "));
        assert_eq!(text.lines().count(), 6 + 9 * 2 + 4 + 1);
    }

    #[test]
    fn units_step_at_768() {
        assert_eq!(format_bytes(767 * 1024, 767 * 1024), "785408 B  ");
        assert_eq!(format_bytes(768 * 1024, 768 * 1024), "   768 KiB");
        assert_eq!(format_bytes(0, 0), "     0 B  ");
        assert_eq!(format_count(749_999, 749_999), " 749999   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
    }

    #[test]
    fn memory_stats_has_pytorchs_keys() {
        let keys = memory_stats(&DeviceStats::default());
        assert_eq!(keys.len(), 108 + 8 + 6);
        for key in [
            "allocated_bytes.all.current",
            "allocation.large_pool.peak",
            "inactive_split_bytes.small_pool.freed",
            "requested_bytes.all.allocated",
            "segment.all.current",
            "reserved_bytes.large_pool.peak",
            "oversize_allocations.current",
            "oversize_segments.peak",
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "max_split_size",
        ] {
            assert!(keys.contains_key(key), "{key}");
        }
        let names: Vec<&String> = keys.keys().collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }
}

/// Parses a size such as `80GiB`, `512MB`, `1.5 GiB` or plain bytes (`1048576`).
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB, GB, TB) of 1000.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a size (try 80GiB, 512MB or a byte count)"))?;
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("unknown unit {unit:?} in {text:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("2kib"), Ok(2048));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-5GB").is_err());
        assert!(parse_size("1e30").is_err());
    }
}
