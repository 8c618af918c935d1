// i32: one element per word; arithmetic wraps, division truncates.
alias V = i32;
fn lift(w: u32) -> V { return bitcast<i32>(w); }
fn lower(v: V) -> u32 { return bitcast<u32>(v); }
fn divide(v: V, n: u32) -> V { return v / i32(n); }
