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
    // Unset or blank: every row, in table order (whatever rows the table has).
    let all = &arch_table::all_target_names();
    let every: Vec<String> = arch_table::TARGETS.iter().map(|t| t.name.to_string()).collect();
    for row in ["sm_90a", "sm_100f", "sm_120f"] {
        assert!(every.iter().any(|r| r == row), "{row}");
    }
    assert_eq!(&inputs::archs(None).unwrap(), &every);
    assert_eq!(inputs::archs(None).unwrap().join(","), *all);
    assert_eq!(inputs::archs(Some("")).unwrap(), every);
    assert_eq!(inputs::archs(Some("  ")).unwrap(), every);
    assert_eq!(inputs::archs(Some("sm_120f, sm_90a,sm_90a")).unwrap(), ["sm_90a", "sm_120f"]);
    assert_eq!(inputs::archs(Some("sm_100f,")).unwrap(), ["sm_100f"]);
    // A GPU's compute capability names the row that runs there (the family rows cover B300 and
    // DGX Spark), and the arch-specific names of before the family rows still select them.
    assert_eq!(inputs::archs(Some("sm_90")).unwrap(), ["sm_90a"]);
    assert_eq!(inputs::archs(Some("sm_103")).unwrap(), ["sm_100f"]);
    assert_eq!(inputs::archs(Some("sm_121,sm_120a")).unwrap(), ["sm_120f"]);
    assert_eq!(inputs::archs(Some("sm_100a,sm_90a,sm_120a")).unwrap(), ["sm_90a", "sm_100f", "sm_120f"]);
    // Every row, by its name and by each compute capability it runs on (also a row added later).
    for t in arch_table::TARGETS {
        assert_eq!(inputs::archs(Some(t.name)).unwrap(), [t.name]);
        for &cc in t.runs_on {
            assert_eq!(inputs::archs(Some(&arch_table::cc_name(cc))).unwrap(), [t.name], "{cc:?}");
        }
    }
    for bad in [",", " , ,", ",,,"] {
        let e = inputs::archs(Some(bad)).unwrap_err();
        one_line_naming(&e, "GRAPHSAFE_CUDA_ARCHS", all);
        assert!(e.contains("selects no arch"), "{e}");
    }
    // A compute capability no row runs on (taken from the table: a literal one stops being
    // unknown the day its row is added).
    let unknown = arch_table::cc_name(arch_table::cc_without_row());
    for bad in [unknown.clone(), format!("sm_90a,{unknown}"), "all".into(), "compute_100f".into()] {
        let e = inputs::archs(Some(&bad)).unwrap_err();
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

#[test]
fn directives_select_table_rows_by_back_end_or_fail_in_one_line() {
    let rows = |v: &str| inputs::directive_archs(v).unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let names = |pick: &dyn Fn(&arch_table::Target) -> bool| arch_table::TARGETS.iter().filter(|t| pick(t)).map(|t| t.name.to_string()).collect::<Vec<_>>();
    assert_eq!(rows("all").0, names(&|_| true));
    // A back-end selects every row that runs it, in table order: a new row with an existing
    // back-end needs no directive change.
    for b in arch_table::Backend::ALL {
        let (picked, selectors) = rows(&b.selector());
        assert_eq!(picked, names(&|t| t.backends.contains(&b)), "{b:?}");
        assert_eq!(selectors, [b.selector()]);
    }
    assert!(rows("mla:sm100").0.contains(&"sm_100f".to_string()));
    assert!(rows("nvfp4:sm120").0.contains(&"sm_120f".to_string()));
    assert!(rows("mla:sm90").0.contains(&"sm_90a".to_string()));
    // Row names, in table order whatever order they are listed in.
    assert_eq!(rows("sm_120f,sm_90a"), (s(&["sm_90a", "sm_120f"]), vec![]));
    for (bad, says) in [
        ("sm_100a", "unknown arch \"sm_100a\""),
        ("sm_90a,sm_103", "unknown arch \"sm_103\""),
        ("mla:sm120", "unknown MLA back-end \"sm120\""),
        ("nvfp4:sm89", "unknown NVFP4 back-end"),
        ("gemm:sm100", "unknown op \"gemm\""),
        (",", "selects no row"),
    ] {
        let e = inputs::directive_archs(bad).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
        assert!(!e.contains('\n'), "more than one line: {e}");
    }
    let e = inputs::directive_archs("sm_100a").unwrap_err();
    assert!(e.contains(&arch_table::all_target_names()), "names the table's rows: {e}");
}

#[test]
fn a_selected_row_whose_back_end_no_unit_implements_is_refused() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let all: Vec<String> = arch_table::Backend::ALL.iter().map(|b| b.selector()).collect();
    assert_eq!(inputs::missing_backend(&inputs::archs(None).unwrap(), &all), None);
    let e = inputs::missing_backend(&s(&["sm_90a", "sm_100f"]), &s(&["mla:sm90", "nvfp4:sm90", "nvfp4:sm100"])).unwrap();
    assert!(e.contains("sm_100f") && e.contains("mla:sm100") && !e.contains('\n'), "{e}");
    // Rows not selected need nothing.
    assert_eq!(inputs::missing_backend(&s(&["sm_90a"]), &s(&["mla:sm90", "nvfp4:sm90"])), None);
}
