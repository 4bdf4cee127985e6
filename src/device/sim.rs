//! The simulation device's settings: the card being simulated.

/// Cards with their memory as `torch.cuda.get_device_properties().total_memory` reports it
/// (a little under the marketing size: the driver keeps some).
pub const PRESETS: [(&str, u64); 8] = [
    ("H100-80GB", 85_045_379_072),
    ("A100-80GB", 85_051_572_224),
    ("A100-40GB", 42_505_273_344),
    ("RTX4090-24GB", 25_386_352_640),
    ("L4-24GB", 23_580_639_232),
    ("T4-16GB", 15_828_320_256),
    ("M2-16GB-unified", 17_179_869_184),
    ("browser-2GB", 2 << 30),
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimOptions {
    pub name: String,
    /// Device memory in bytes.
    pub capacity: u64,
}

impl SimOptions {
    /// A preset by name (case-insensitive); unknown names fall back to a custom-named 80 GiB card.
    pub fn preset(name: &str) -> SimOptions {
        SimOptions::find(name).unwrap_or(SimOptions { name: name.to_string(), capacity: 80 << 30 })
    }

    pub fn find(name: &str) -> Option<SimOptions> {
        PRESETS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(n, capacity)| SimOptions { name: n.to_string(), capacity })
    }

    pub fn custom(capacity: u64) -> SimOptions {
        SimOptions { name: format!("custom {}", crate::alloc::format_size(capacity)), capacity }
    }
}
