// bf16: two elements per word (low half first), computed in f32 and rounded
// back to nearest even, as half::bf16::from_f32 does. WGSL has no bf16, so
// the conversions are shifts.
alias V = vec2<f32>;
fn lift(w: u32) -> V {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return (b >> 16u) | 0x40u; // NaN stays a (quiet) NaN
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
fn lower(v: V) -> u32 { return bf16_bits(v.x) | (bf16_bits(v.y) << 16u); }
fn divide(v: V, n: u32) -> V { return v / f32(n); }
