//! The `Communicator` page reads in the order a user needs: each call
//! before the `_into` and `_in_place` forms that refer to it (rustdoc lists
//! methods in source order).

#[test]
fn each_call_comes_before_its_into_and_in_place_forms() {
    let src = include_str!("../src/api/comm.rs");
    let at = |name: &str| -> usize {
        let pat = format!("    pub fn {name}(");
        src.find(&pat)
            .or_else(|| src.find(&format!("    pub fn {name}<")))
            .unwrap_or_else(|| panic!("no `pub fn {name}` in src/api/comm.rs"))
    };
    for call in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "all_to_all",
    ] {
        for form in ["_into", "_in_place"] {
            let name = format!("{call}{form}");
            let pat = format!("    pub fn {name}(");
            if src.contains(&pat) {
                assert!(at(call) < at(&name), "`{call}` comes after `{name}`");
            }
        }
    }
}
