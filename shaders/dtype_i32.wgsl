// i32: four elements per unit; arithmetic wraps, division truncates.
alias U = vec4<u32>;
alias V = vec4<i32>;
fn lift(w: U) -> V { return bitcast<V>(w); }
fn lower(v: V) -> U { return bitcast<U>(v); }
fn divide(v: V, n: u32) -> V { return v / V(i32(n)); }
