//! Allocator settings in the `PYTORCH_CUDA_ALLOC_CONF` syntax, with PyTorch's validation.
//!
//! `key:value,key2:value2`, lists in brackets (`roundup_power2_divisions:[256:1,512:2,>:8]`),
//! whitespace ignored, booleans `True`/`False`. Unknown keys are errors, as in PyTorch.

use super::constants::*;
use std::fmt;

/// Number of power-of-two intervals for per-size roundup divisions: 1 MB .. 32 GB.
pub const ROUNDUP_INTERVALS: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks of at least this size are never split ("oversize"); `u64::MAX` = unlimited.
    pub max_split_size: u64,
    /// How much larger than a request an oversize cached block may be and still be reused.
    pub max_non_split_rounding_size: u64,
    /// Divisions per power-of-two interval (index 0: sizes below 2 MB ... 15: 32 GB and up).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are reclaimed (0 = off).
    pub garbage_collection_threshold: f64,
    pub expandable_segments: bool,
    /// Limit on reserved memory as a fraction of the device capacity (`set_per_process_memory_fraction`).
    pub per_process_memory_fraction: Option<f64>,
    pub release_lock_on_cudamalloc: bool,
    pub pinned_use_cuda_host_register: bool,
    pub pinned_num_register_threads: u64,
    pub pinned_use_background_threads: bool,
    /// The last raw settings string, as `allocator_settings["PYTORCH_CUDA_ALLOC_CONF"]` reports it.
    pub raw: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: LARGE_BUFFER,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: None,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            raw: String::new(),
        }
    }
}

/// A settings string PyTorch would refuse, with PyTorch's reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid allocator config {raw:?}: {message}")]
pub struct ConfigError {
    pub raw: String,
    pub message: String,
}

const MB: u64 = 1024 * 1024;

impl AllocatorConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string on top of the defaults.
    pub fn parse(text: &str) -> Result<AllocatorConfig, ConfigError> {
        let mut config = AllocatorConfig::default();
        config.apply(text)?;
        Ok(config)
    }

    /// Reads `PYTORCH_CUDA_ALLOC_CONF`, then `PYTORCH_ALLOC_CONF`, as PyTorch does.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        let text = std::env::var("PYTORCH_CUDA_ALLOC_CONF").or_else(|_| std::env::var("PYTORCH_ALLOC_CONF"));
        match text {
            Ok(t) => AllocatorConfig::parse(&t),
            Err(_) => Ok(AllocatorConfig::default()),
        }
    }

    /// Applies settings over the current ones (like `_set_allocator_settings`).
    pub fn apply(&mut self, text: &str) -> Result<(), ConfigError> {
        self.apply_keys(text, None)
    }

    /// `apply`, where `unknown` (if given) collects keys this version does not know instead of
    /// refusing them: a snapshot from a newer PyTorch may name settings tensormem does not model.
    fn apply_keys(&mut self, text: &str, mut unknown: Option<&mut Vec<String>>) -> Result<(), ConfigError> {
        let tokens = tokenize(text);
        let err = |message: String| ConfigError { raw: text.to_string(), message };
        let mut i = 0;
        while i < tokens.len() {
            let key = tokens[i].as_str();
            if key == "," {
                i += 1;
                continue;
            }
            if tokens.get(i + 1).map(String::as_str) != Some(":") {
                return Err(err(format!("expected ':' after {key:?}")));
            }
            let value_at = i + 2;
            let value = tokens.get(value_at).map(String::as_str).ok_or_else(|| err(format!("missing value for {key}")))?;
            let mut consumed = 1;
            match key {
                "max_split_size_mb" => {
                    let mb = parse_uint(value).ok_or_else(|| err(format!("max_split_size_mb expects a number, got {value:?}")))?;
                    if mb < LARGE_BUFFER / MB {
                        return Err(err(format!("max_split_size_mb too small, must be >= {}", LARGE_BUFFER / MB)));
                    }
                    self.max_split_size = mb.saturating_mul(MB);
                }
                "max_non_split_rounding_mb" => {
                    let mb = parse_uint(value).ok_or_else(|| err(format!("max_non_split_rounding_mb expects a number, got {value:?}")))?;
                    if mb < LARGE_BUFFER / MB {
                        return Err(err(format!("max_non_split_rounding_mb too small, must be >= {}", LARGE_BUFFER / MB)));
                    }
                    self.max_non_split_rounding_size = mb.saturating_mul(MB);
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value.parse().map_err(|_| err(format!("garbage_collection_threshold expects a number, got {value:?}")))?;
                    // PyTorch checks `val > 0` then `val < 1.0`: NaN fails the first.
                    if t.is_nan() || t <= 0.0 {
                        return Err(err("garbage_collect_threshold too small, set it 0.0~1.0".into()));
                    }
                    if t >= 1.0 {
                        return Err(err("garbage_collect_threshold too big, set it 0.0~1.0".into()));
                    }
                    self.garbage_collection_threshold = t;
                }
                "roundup_power2_divisions" => {
                    consumed = self.parse_divisions(&tokens[value_at..]).map_err(err)?;
                }
                "expandable_segments" => self.expandable_segments = parse_bool(key, value).map_err(err)?,
                "release_lock_on_cudamalloc" => self.release_lock_on_cudamalloc = parse_bool(key, value).map_err(err)?,
                "pinned_use_cuda_host_register" => self.pinned_use_cuda_host_register = parse_bool(key, value).map_err(err)?,
                "pinned_use_background_threads" => self.pinned_use_background_threads = parse_bool(key, value).map_err(err)?,
                "pinned_num_register_threads" => {
                    let n = parse_uint(value).filter(|n| n.is_power_of_two() && *n <= 128);
                    self.pinned_num_register_threads =
                        n.ok_or_else(|| err(format!("Number of register threads has to be power of 2 and less than or equal to 128, got {value}")))?;
                }
                "per_process_memory_fraction" => {
                    let f: f64 = value.parse().map_err(|_| err(format!("per_process_memory_fraction expects a number, got {value:?}")))?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(err(format!("per_process_memory_fraction must be in [0.0, 1.0], got {f}")));
                    }
                    self.per_process_memory_fraction = (f < 1.0).then_some(f);
                }
                "backend" => {
                    if value != "native" {
                        return Err(err(format!("backend {value:?} is not modelled: tensormem implements PyTorch's native caching allocator")));
                    }
                }
                // Accepted and without effect on a device that has no CUDA graphs or pinned pool yet.
                "graph_capture_record_stream_reuse" | "pinned_reserve_segment_size_mb" => {}
                _ => match unknown.as_deref_mut() {
                    Some(keys) => {
                        keys.push(key.to_string());
                        if value == "[" {
                            consumed = tokens[value_at..].iter().position(|t| t == "]").map_or(tokens.len() - value_at, |end| end + 1);
                        }
                    }
                    None => return Err(err(format!("Unrecognized key '{key}' in CUDA allocator config."))),
                },
            }
            i = value_at + consumed;
            match tokens.get(i).map(String::as_str) {
                None | Some(",") => {}
                Some(t) => return Err(err(format!("expected ',' before {t:?}"))),
            }
        }
        self.raw = text.to_string();
        Ok(())
    }

    /// `4` or `[256:1,512:2,1024:4,>:8]`; returns how many tokens it used.
    fn parse_divisions(&mut self, tokens: &[String]) -> Result<usize, String> {
        let check = |v: u64| {
            if v == 0 || v.is_power_of_two() {
                Ok(v)
            } else {
                Err(format!("For roundups, the divisions has to be power of 2 or 0 to disable roundup, got {v}"))
            }
        };
        if tokens.first().map(String::as_str) != Some("[") {
            let value = tokens.first().ok_or("missing value for roundup_power2_divisions")?;
            let v = parse_uint(value).ok_or_else(|| format!("roundup_power2_divisions expects a number, got {value:?}"))?;
            self.roundup_power2_divisions = [check(v)?; ROUNDUP_INTERVALS];
            return Ok(1);
        }
        let mut i = 1;
        let mut last_index: Option<usize> = None;
        loop {
            let key = tokens.get(i).ok_or("unterminated list for roundup_power2_divisions")?;
            if key == "]" {
                return Ok(i + 1);
            }
            if key == "," {
                i += 1;
                continue;
            }
            if tokens.get(i + 1).map(String::as_str) != Some(":") {
                return Err(format!("expected ':' after {key:?} in roundup_power2_divisions"));
            }
            let value = tokens.get(i + 2).ok_or("missing value in roundup_power2_divisions")?;
            let v = check(parse_uint(value).ok_or_else(|| format!("roundup_power2_divisions expects numbers, got {value:?}"))?)?;
            if key == ">" {
                let from = last_index.map_or(0, |l| l + 1);
                self.roundup_power2_divisions[from..].fill(v);
            } else {
                let mb = parse_uint(key).ok_or_else(|| format!("roundup_power2_divisions expects sizes in MB, got {key:?}"))?;
                if !mb.is_power_of_two() {
                    return Err(format!("For roundups, the intervals have to be power of 2, got {mb}"));
                }
                let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                if last_index.is_none() {
                    // The first listed interval also covers all the smaller ones.
                    self.roundup_power2_divisions[..index].fill(v);
                }
                self.roundup_power2_divisions[index] = v;
                last_index = Some(index);
            }
            i += 3;
        }
    }

    /// Divisions that apply to a request of `size` bytes.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log2 = 63 - size.max(1).leading_zeros() as i64;
        let index = (log2 - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1);
        self.roundup_power2_divisions[index as usize]
    }

    /// The settings as a snapshot's `allocator_settings` dict reports them.
    pub fn to_snapshot_settings(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::json;
        let mut divisions = serde_json::Map::new();
        for (i, d) in self.roundup_power2_divisions.iter().enumerate() {
            divisions.insert((1u64 << i).to_string(), json!(d));
        }
        let mut map = serde_json::Map::new();
        map.insert("PYTORCH_CUDA_ALLOC_CONF".into(), json!(self.raw));
        map.insert("max_split_size".into(), json!(self.max_split_size_stat()));
        map.insert("garbage_collection_threshold".into(), json!(self.garbage_collection_threshold));
        map.insert("expandable_segments".into(), json!(self.expandable_segments));
        map.insert("pinned_num_register_threads".into(), json!(self.pinned_num_register_threads));
        map.insert("release_lock_on_cudamalloc".into(), json!(self.release_lock_on_cudamalloc));
        map.insert("pinned_use_cuda_host_register".into(), json!(self.pinned_use_cuda_host_register));
        map.insert("roundup_power2_divisions".into(), serde_json::Value::Object(divisions));
        map
    }

    /// Settings recorded in a snapshot (structured fields win; older files have none: defaults).
    /// Both the settings string and the fields must be what PyTorch could have run with: a file
    /// whose settings PyTorch would refuse was not recorded by it.
    pub fn from_snapshot_settings(settings: &serde_json::Map<String, serde_json::Value>) -> Result<AllocatorConfig, ConfigError> {
        let raw = match settings.get("PYTORCH_CUDA_ALLOC_CONF") {
            None | Some(serde_json::Value::Null) => "",
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(other) => return Err(ConfigError { raw: other.to_string(), message: "PYTORCH_CUDA_ALLOC_CONF is not a string".into() }),
        };
        let bad = |message: String| ConfigError { raw: raw.to_string(), message };
        let mut config = AllocatorConfig::default();
        config.apply_keys(raw, Some(&mut Vec::new()))?;
        if let Some(v) = settings.get("max_split_size") {
            // PyTorch writes the size_t as an int64: unlimited (SIZE_MAX) is -1, and a setting of
            // 2^43 MB or more wraps to another negative number, still a whole number of MiB.
            config.max_split_size = match (v.as_i64(), v.as_u64()) {
                (Some(-1), _) | (_, Some(u64::MAX)) => u64::MAX,
                (Some(b), _) if b >= LARGE_BUFFER as i64 || (b < 0 && (b as u64).is_multiple_of(MB)) => b as u64,
                _ => return Err(bad(format!("max_split_size {v} is neither -1 (unlimited) nor at least PyTorch's minimum of {LARGE_BUFFER} bytes"))),
            };
        }
        if let Some(v) = settings.get("garbage_collection_threshold") {
            // 0 is "off"; a NaN in a pickle reaches here as null.
            config.garbage_collection_threshold =
                v.as_f64().filter(|t| (0.0..1.0).contains(t)).ok_or_else(|| bad(format!("garbage_collection_threshold {v} is not a number in [0, 1)")))?;
        }
        if let Some(v) = settings.get("expandable_segments") {
            config.expandable_segments = v.as_bool().ok_or_else(|| bad(format!("expandable_segments {v} is not True or False")))?;
        }
        if let Some(serde_json::Value::Object(divs)) = settings.get("roundup_power2_divisions") {
            for (k, v) in divs {
                let mb: u64 = k.parse().map_err(|_| bad(format!("roundup_power2_divisions key {k:?} is not a size in MB")))?;
                if !mb.is_power_of_two() {
                    return Err(bad(format!("roundup_power2_divisions key {mb} is not a power of two")));
                }
                let index = (mb.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
                config.roundup_power2_divisions[index] = v
                    .as_u64()
                    .filter(|d| *d == 0 || d.is_power_of_two())
                    .ok_or_else(|| bad(format!("roundup_power2_divisions[{k}] = {v} is not 0 or a power of 2")))?;
            }
        }
        config.raw = raw.to_string();
        Ok(config)
    }

    /// `memory_stats()["max_split_size"]`: -1 when unlimited.
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_size == u64::MAX { -1 } else { self.max_split_size as i64 }
    }
}

impl fmt::Display for AllocatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.raw.is_empty() { f.write_str("(defaults)") } else { f.write_str(&self.raw) }
    }
}

fn tokenize(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        match c {
            ',' | ':' | '[' | ']' => {
                if !current.is_empty() {
                    tokens.push(std::mem::take(&mut current));
                }
                tokens.push(c.to_string());
            }
            c if c.is_whitespace() => {}
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        tokens.push(current);
    }
    tokens
}

fn parse_uint(s: &str) -> Option<u64> {
    s.parse().ok()
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "True" | "true" => Ok(true),
        "False" | "false" => Ok(false),
        _ => Err(format!("Expected a single True/False argument for {key}, got {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_common_key() {
        let c = AllocatorConfig::parse("max_split_size_mb:128, roundup_power2_divisions:4,garbage_collection_threshold:0.8,expandable_segments:True").unwrap();
        assert_eq!(c.max_split_size, 128 * MB);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert_eq!(c.garbage_collection_threshold, 0.8);
        assert!(c.expandable_segments);
    }

    #[test]
    fn divisions_list_fills_below_first_and_after_last() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        // 256 MB is interval 8: intervals 0..=8 take 1, 9 takes 2, 10 takes 4, 11.. take 8.
        assert_eq!(c.roundup_power2_divisions, [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]);
        assert_eq!(c.divisions_for(300 * MB), 1);
        assert_eq!(c.divisions_for(600 * MB), 2);
        assert_eq!(c.divisions_for(3 << 30), 8);
    }

    #[test]
    fn pytorch_validation_errors() {
        let msg = |s: &str| AllocatorConfig::parse(s).unwrap_err().message;
        assert_eq!(msg("max_split_size_mb:19"), "max_split_size_mb too small, must be >= 20");
        assert!(msg("roundup_power2_divisions:3").contains("power of 2"));
        assert!(msg("roundup_power2_divisions:[3:4]").contains("intervals have to be power of 2"));
        assert_eq!(msg("foo:1"), "Unrecognized key 'foo' in CUDA allocator config.");
        assert!(msg("expandable_segments:yes").contains("True/False"));
        assert!(msg("garbage_collection_threshold:1.5").contains("too big"));
        assert!(msg("max_split_size_mb").contains("expected ':'"));
        assert!(AllocatorConfig::parse("max_split_size_mb:20").is_ok());
        assert!(AllocatorConfig::parse("").is_ok());
        // PyTorch checks `val > 0` and `val < 1.0`: NaN is refused as too small, inf as too big.
        assert!(msg("garbage_collection_threshold:NaN").contains("too small"));
        assert!(msg("garbage_collection_threshold:inf").contains("too big"));
    }

    fn settings(pairs: &[(&str, serde_json::Value)]) -> serde_json::Map<String, serde_json::Value> {
        let mut map = AllocatorConfig::default().to_snapshot_settings();
        for (k, v) in pairs {
            map.insert(k.to_string(), v.clone());
        }
        map
    }

    #[test]
    fn snapshot_settings_pytorch_would_refuse_are_refused() {
        use serde_json::json;
        let msg = |pairs: &[(&str, serde_json::Value)]| AllocatorConfig::from_snapshot_settings(&settings(pairs)).unwrap_err().message;
        assert_eq!(msg(&[("PYTORCH_CUDA_ALLOC_CONF", json!("max_split_size_mb:-5"))]), "max_split_size_mb expects a number, got \"-5\"");
        assert!(msg(&[("PYTORCH_CUDA_ALLOC_CONF", json!("expandable_segments:maybe"))]).contains("True/False"));
        assert!(msg(&[("expandable_segments", json!("maybe"))]).contains("not True or False"));
        assert!(msg(&[("garbage_collection_threshold", json!(null))]).contains("not a number in [0, 1)"));
        assert!(msg(&[("garbage_collection_threshold", json!(1.5))]).contains("not a number in [0, 1)"));
        assert!(msg(&[("max_split_size", json!(-5))]).contains("neither -1"));
        assert!(msg(&[("max_split_size", json!(1024))]).contains("neither -1"));
        assert!(msg(&[("roundup_power2_divisions", json!({"1": 3}))]).contains("power of 2"));
        // Keys of a newer PyTorch are not this file's fault; their values are skipped.
        let c = AllocatorConfig::from_snapshot_settings(&settings(&[("PYTORCH_CUDA_ALLOC_CONF", json!("new_key:[1:2,3:4],max_split_size_mb:128"))])).unwrap();
        assert_eq!(c.raw, "new_key:[1:2,3:4],max_split_size_mb:128");
        // The structured fields (here the defaults) win over the string, as before.
        assert_eq!(c.max_split_size, u64::MAX);
        let unlimited = AllocatorConfig::from_snapshot_settings(&settings(&[("max_split_size", json!(u64::MAX))])).unwrap();
        assert_eq!(unlimited.max_split_size, u64::MAX);
        // A setting past i64::MAX bytes is written wrapped, as PyTorch's int64 cast writes it, and
        // read back as it was set.
        let huge = AllocatorConfig::parse("max_split_size_mb:9000000000000").unwrap();
        assert!(huge.max_split_size_stat() < -1);
        assert_eq!(AllocatorConfig::from_snapshot_settings(&huge.to_snapshot_settings()).unwrap(), huge);
    }

    #[test]
    fn snapshot_settings_round_trip() {
        let c = AllocatorConfig::parse("max_split_size_mb:128,roundup_power2_divisions:[2:4,>:8],expandable_segments:True").unwrap();
        let back = AllocatorConfig::from_snapshot_settings(&c.to_snapshot_settings()).unwrap();
        assert_eq!(back, c);
        assert_eq!(AllocatorConfig::default().to_snapshot_settings()["max_split_size"], -1);
    }
}
