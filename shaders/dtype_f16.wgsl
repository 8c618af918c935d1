// f16: four elements in two words, computed in f32 and rounded back.
alias U = vec2<u32>;
alias V = vec4<f32>;
fn lift(w: U) -> V { return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)); }
// A NaN (canonical by then: see shaders/order_float.wgsl) becomes f16's
// canonical quiet NaN 0x7e00, which pack2x16float leaves undefined.
fn nan_halves(v: vec2<f32>, packed: u32) -> u32 {
    let b = bitcast<vec2<u32>>(v) & vec2<u32>(0x7fffffffu);
    let lo = select(packed, (packed & 0xffff0000u) | 0x7e00u, b.x > 0x7f800000u);
    return select(lo, (lo & 0x0000ffffu) | 0x7e000000u, b.y > 0x7f800000u);
}
fn lower(v: V) -> U {
    return vec2<u32>(nan_halves(v.xy, pack2x16float(v.xy)), nan_halves(v.zw, pack2x16float(v.zw)));
}
fn divide(v: V, n: u32) -> V { return v / f32(n); }
