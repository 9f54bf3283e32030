//! The build script's environment checks (build/inputs.rs, included as-is): every bad value is a
//! one-line error naming the variable and the accepted values.

#[path = "../src/arch_table.rs"]
#[allow(dead_code)]
mod arch_table;
#[path = "../build/inputs.rs"]
#[allow(dead_code)]
mod inputs;

fn one_line_naming(e: &str, var: &str, accepted: &str) {
    assert!(e.contains(var), "{e}");
    assert!(e.contains(accepted), "{e}");
    assert!(!e.contains('\n'), "more than one line: {e}");
}

#[test]
fn cuda_archs_select_a_non_empty_set_or_fail_in_one_line() {
    let all = "sm_90a,sm_100f,sm_120f";
    assert_eq!(inputs::archs(None).unwrap(), ["sm_90a", "sm_100f", "sm_120f"]);
    assert_eq!(inputs::archs(None).unwrap().join(","), arch_table::all_target_names());
    assert_eq!(inputs::archs(Some("")).unwrap().len(), 3);
    assert_eq!(inputs::archs(Some("  ")).unwrap().len(), 3);
    assert_eq!(inputs::archs(Some("sm_120f, sm_90a,sm_90a")).unwrap(), ["sm_90a", "sm_120f"]);
    assert_eq!(inputs::archs(Some("sm_100f,")).unwrap(), ["sm_100f"]);
    // A GPU's compute capability names the row that runs there (the family rows cover B300 and
    // DGX Spark), and the arch-specific names of before the family rows still select them.
    assert_eq!(inputs::archs(Some("sm_90")).unwrap(), ["sm_90a"]);
    assert_eq!(inputs::archs(Some("sm_103")).unwrap(), ["sm_100f"]);
    assert_eq!(inputs::archs(Some("sm_121,sm_120a")).unwrap(), ["sm_120f"]);
    assert_eq!(inputs::archs(Some("sm_100a,sm_90a,sm_120a")).unwrap(), ["sm_90a", "sm_100f", "sm_120f"]);
    for bad in [",", " , ,", ",,,"] {
        let e = inputs::archs(Some(bad)).unwrap_err();
        one_line_naming(&e, "GRAPHSAFE_CUDA_ARCHS", all);
        assert!(e.contains("selects no arch"), "{e}");
    }
    for bad in ["sm_89", "sm_90a,sm_89", "all", "sm_110", "compute_100f"] {
        let e = inputs::archs(Some(bad)).unwrap_err();
        one_line_naming(&e, "GRAPHSAFE_CUDA_ARCHS", all);
        assert!(e.contains("unknown arch") && e.contains("sm_100f (sm_100/sm_103)"), "{e}");
    }
}

#[test]
fn offline_and_bindings_take_only_their_documented_values() {
    for (v, want) in [(None, false), (Some(""), false), (Some("0"), false), (Some("1"), true), (Some(" 1 "), true)] {
        assert_eq!(inputs::offline(v).unwrap(), want, "{v:?}");
    }
    for bad in ["yes", "true", "2"] {
        one_line_naming(&inputs::offline(Some(bad)).unwrap_err(), "GRAPHSAFE_OFFLINE", "expected 1");
    }
    for (v, want) in [(None, false), (Some(""), false), (Some("check"), false), (Some("write"), true)] {
        assert_eq!(inputs::bindings_write(v).unwrap(), want, "{v:?}");
    }
    one_line_naming(&inputs::bindings_write(Some("overwrite")).unwrap_err(), "GRAPHSAFE_BINDINGS", "write, check or unset");
}
