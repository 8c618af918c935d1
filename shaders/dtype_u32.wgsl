// u32: four elements per unit; arithmetic wraps.
alias U = vec4<u32>;
alias V = vec4<u32>;
fn lift(w: U) -> V { return w; }
fn lower(v: V) -> U { return v; }
fn divide(v: V, n: u32) -> V { return v / V(n); }
