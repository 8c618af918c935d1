// u32: one element per word; arithmetic wraps.
alias V = u32;
fn lift(w: u32) -> V { return w; }
fn lower(v: V) -> u32 { return v; }
fn divide(v: V, n: u32) -> V { return v / n; }
