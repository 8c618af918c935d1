// f16: four elements in two words, computed in f32 and rounded back.
alias U = vec2<u32>;
alias V = vec4<f32>;
fn lift(w: U) -> V { return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)); }
fn lower(v: V) -> U { return vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw)); }
fn divide(v: V, n: u32) -> V { return v / f32(n); }
