// Min, max and NaN for the float dtypes (V = vec4<f32>), spelled out so
// that every adapter and the host fold (src/algo/fold.rs) give the same
// bits: WGSL leaves min and max of a NaN, of -0 against +0, and the
// payload of any NaN to the implementation.
//
// A NaN on either side wins and every NaN comes out as the one canonical
// quiet NaN (0x7fc00000; the dtype's `lower` keeps it canonical in 16
// bits). Equal values meet on their bits: OR for min, so min(-0, +0) is
// -0; AND for max, so max(-0, +0) is +0. The tests are on the raw bits,
// which no float optimisation can drop.

fn is_nan(v: V) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

fn canon(v: V) -> V {
    return select(v, bitcast<V>(vec4<u32>(0x7fc00000u)), is_nan(v));
}

fn ordered_min(a: V, b: V) -> V {
    let ties = bitcast<V>(bitcast<vec4<u32>>(a) | bitcast<vec4<u32>>(b));
    let m = select(select(ties, b, b < a), a, a < b);
    return select(m, bitcast<V>(vec4<u32>(0x7fc00000u)), is_nan(a) | is_nan(b));
}

fn ordered_max(a: V, b: V) -> V {
    let ties = bitcast<V>(bitcast<vec4<u32>>(a) & bitcast<vec4<u32>>(b));
    let m = select(select(ties, b, b > a), a, a > b);
    return select(m, bitcast<V>(vec4<u32>(0x7fc00000u)), is_nan(a) | is_nan(b));
}
