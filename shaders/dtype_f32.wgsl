// f32: four elements per unit.
alias U = vec4<u32>;
alias V = vec4<f32>;
fn lift(w: U) -> V { return bitcast<V>(w); }
fn lower(v: V) -> U { return bitcast<U>(v); }
fn divide(v: V, n: u32) -> V { return v / f32(n); }
