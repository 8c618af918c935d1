// f32: one element per word.
alias V = f32;
fn lift(w: u32) -> V { return bitcast<f32>(w); }
fn lower(v: V) -> u32 { return bitcast<u32>(v); }
fn divide(v: V, n: u32) -> V { return v / f32(n); }
