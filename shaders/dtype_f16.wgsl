// f16: two elements per word, computed in f32 and rounded back.
alias V = vec2<f32>;
fn lift(w: u32) -> V { return unpack2x16float(w); }
fn lower(v: V) -> u32 { return pack2x16float(v); }
fn divide(v: V, n: u32) -> V { return v / f32(n); }
