//! The build script's environment checks (build/inputs.rs, included as-is): every bad value is a
//! one-line error naming the variable and the accepted values.

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
    assert_eq!(inputs::archs(None).unwrap(), ["sm_90a", "sm_100a", "sm_120a"]);
    assert_eq!(inputs::archs(Some("")).unwrap().len(), 3);
    assert_eq!(inputs::archs(Some("  ")).unwrap().len(), 3);
    assert_eq!(inputs::archs(Some("sm_120a, sm_90a,sm_90a")).unwrap(), ["sm_90a", "sm_120a"]);
    assert_eq!(inputs::archs(Some("sm_100a,")).unwrap(), ["sm_100a"]);
    for bad in [",", " , ,", ",,,"] {
        let e = inputs::archs(Some(bad)).unwrap_err();
        one_line_naming(&e, "GRAPHSAFE_CUDA_ARCHS", "sm_90a,sm_100a,sm_120a");
        assert!(e.contains("selects no arch"), "{e}");
    }
    for bad in ["sm_90", "sm_90a,sm_89", "all"] {
        let e = inputs::archs(Some(bad)).unwrap_err();
        one_line_naming(&e, "GRAPHSAFE_CUDA_ARCHS", "sm_90a,sm_100a,sm_120a");
        assert!(e.contains("unknown arch"), "{e}");
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
