//! Work on more than one core natively, one thing after another in the browser's worker (wasm
//! has no threads there).

/// `a` and `b`, natively at once (`b` on a thread of its own, `a` on this one) when `worth_it`
/// (a thread costs tens of microseconds: work on a short trace is done sooner on one).
#[cfg_attr(target_arch = "wasm32", allow(unused_variables))]
pub(crate) fn join<A, B: Send>(worth_it: bool, a: impl FnOnce() -> A, b: impl FnOnce() -> B + Send) -> (A, B) {
    #[cfg(not(target_arch = "wasm32"))]
    if worth_it {
        return std::thread::scope(|scope| {
            let b = scope.spawn(b);
            let a = a();
            (a, b.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
        });
    }
    (a(), b())
}

/// `f` over each of `items`, in order: natively each on a thread of its own.
pub(crate) fn each<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::thread::scope(|scope| {
            let f = &f;
            let running: Vec<_> = items.iter().map(|item| scope.spawn(move || f(item))).collect();
            running.into_iter().map(|r| r.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        })
    }
    #[cfg(target_arch = "wasm32")]
    {
        items.iter().map(f).collect()
    }
}
