// Min and max for the integer dtypes: WGSL's, which are exact; there is
// no NaN to make canonical.

fn canon(v: V) -> V {
    return v;
}

fn ordered_min(a: V, b: V) -> V {
    return min(a, b);
}

fn ordered_max(a: V, b: V) -> V {
    return max(a, b);
}
