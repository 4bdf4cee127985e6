//! The clocks, in one place at the bottom of the layers: the wall clock the allocator stamps
//! trace entries with (microseconds since the epoch, as PyTorch's), and a monotonic one for
//! timing. `std::time` panics on wasm32, so in a browser both come from JavaScript.

/// Seconds since some fixed point, for timing: the OS's monotonic clock, or the browser's
/// `performance.now()` (finer than `Date.now()`'s milliseconds; that where it is missing).
pub(crate) fn now_s() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        use wasm_bindgen::JsCast;
        let global = js_sys::global();
        let precise = js_sys::Reflect::get(&global, &"performance".into()).ok().and_then(|performance| {
            let now = js_sys::Reflect::get(&performance, &"now".into()).ok()?.dyn_into::<js_sys::Function>().ok()?;
            now.call0(&performance).ok()?.as_f64()
        });
        precise.unwrap_or_else(js_sys::Date::now) / 1000.0
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed().as_secs_f64()
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn wall_clock_us() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    since_epoch.as_micros() as i64
}

/// `std::time` panics on wasm32: the browser's clock instead (milliseconds, fractional).
#[cfg(target_arch = "wasm32")]
pub(crate) fn wall_clock_us() -> i64 {
    (js_sys::Date::now() * 1000.0) as i64
}
