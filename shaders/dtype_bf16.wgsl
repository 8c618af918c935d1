// bf16: four elements in two words (low half first), computed in f32 and
// rounded back to nearest even, as half::bf16::from_f32 does. WGSL has no
// bf16, so the conversions are shifts.
alias U = vec2<u32>;
alias V = vec4<f32>;
fn lift(w: U) -> V {
    let lo = vec2<u32>(w.x << 16u, w.y << 16u);
    let hi = w & vec2<u32>(0xffff0000u);
    return bitcast<V>(vec4<u32>(lo.x, hi.x, lo.y, hi.y));
}
fn bf16_bits(x: V) -> vec4<u32> {
    let b = bitcast<vec4<u32>>(x);
    let rounded = (b + vec4<u32>(0x7fffu) + ((b >> vec4<u32>(16u)) & vec4<u32>(1u))) >> vec4<u32>(16u);
    let nan = (b & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
    // A NaN stays a (quiet) NaN instead of rounding into infinity.
    return select(rounded, (b >> vec4<u32>(16u)) | vec4<u32>(0x40u), nan);
}
fn lower(v: V) -> U {
    let h = bf16_bits(v);
    return vec2<u32>(h.x | (h.y << 16u), h.z | (h.w << 16u));
}
fn divide(v: V, n: u32) -> V { return v / f32(n); }
