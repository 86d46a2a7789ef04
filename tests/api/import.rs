//! `holdfast import`: a catalogue file loaded into the app's own database,
//! then read through the API; reruns, bad rows and both formats.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::backend_tests;
use crate::helpers::{unique, TestApp};

fn import(app: &TestApp, file: &Path, extra: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("import")
        .arg(file)
        .args(extra)
        .env("HOLDFAST_DATABASE_URL", app.database_url())
        .env_remove("HOLDFAST_API_KEYS")
        .output()
        .expect("holdfast import runs")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique("holdfast-import"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

async fn a_csv_catalogue_is_readable_filterable_and_a_rerun_changes_nothing(app: TestApp) {
    let p = unique("IM");
    let csv = format!(
        "id,name,price_amount,price_currency,attr.region,attr.digits,attr.premium\n\
         {p}-1,\"Plate AB 12, X\",150000000,IDR,AB,2,true\n\
         {p}-2,Plate AB 1234 Y,,,AB,4,false\n\
         {p}-3,Plate B 7 Z,250000000,IDR,B,007,\n"
    );
    let path = file("plates.csv", &csv);
    let first = import(&app, &path, &["--batch-size", "2"]);
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("3 rows read: 3 new, 0 already present"),
        "{}",
        text(&first)
    );

    let one = app.get_json(&format!("/v1/assets/{p}-1")).await;
    assert_eq!(one["name"], "Plate AB 12, X");
    assert_eq!(one["price"]["amount"], 150000000);
    assert_eq!(one["price"]["currency"], "IDR");
    assert_eq!(one["attributes"]["digits"], 2);
    assert_eq!(one["attributes"]["premium"], true);
    assert_eq!(one["status"], "AVAILABLE");
    let two = app.get_json(&format!("/v1/assets/{p}-2")).await;
    assert!(two["price"].is_null(), "{two}");
    // "007" is no integer as written: a string, as the filter reads it.
    let three = app.get_json(&format!("/v1/assets/{p}-3")).await;
    assert_eq!(three["attributes"]["digits"], "007");
    assert!(three["attributes"].get("premium").is_none(), "{three}");

    // The filters find them through the attribute index.
    let page = app
        .get_json(&format!("/v1/assets?id_prefix={p}&attribute=digits:2"))
        .await;
    let ids: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [format!("{p}-1")]);
    let page = app
        .get_json(&format!("/v1/assets?id_prefix={p}&attribute=region:AB"))
        .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2, "{page}");

    // A hold works on an imported asset, at its price.
    let held = app.hold(&format!("{p}-1"), "importer-buyer", 60).await;
    assert_eq!(held["price"]["amount"], 150000000);

    let again = import(&app, &path, &[]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("0 new, 3 already present")
            && text(&again).contains("Nothing changed"),
        "{}",
        text(&again)
    );
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) AS n FROM assets WHERE id LIKE '{p}-%'"
        ))
        .await,
        3
    );
    let (ok, doc) = crate::audit::audit(&app);
    assert!(ok, "{doc}");
}

async fn a_bad_row_stops_its_batch_and_names_its_line(app: TestApp) {
    let p = unique("IB");
    let csv = format!(
        "id,name,price_amount,price_currency\n\
         {p}-1,One,100,EUR\n\
         {p}-2,Two,200,EUR\n\
         {p}-3,Three,300,EUR\n\
         {p}-4,Four,-5,EUR\n\
         {p}-5,Five,500,EUR\n"
    );
    let path = file("bad.csv", &csv);
    let out = import(&app, &path, &["--batch-size", "2"]);
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("line 5: price.amount"), "{said}");
    assert!(said.contains("rows before line 4 are imported"), "{said}");
    let stored = |n: u8| format!("SELECT count(*) AS n FROM assets WHERE id = '{p}-{n}'");
    // The first batch (lines 2 and 3) stays; nothing of the bad row's batch.
    assert_eq!(app.count(&stored(1)).await, 1);
    assert_eq!(app.count(&stored(2)).await, 1);
    assert_eq!(app.count(&stored(3)).await, 0);
    assert_eq!(app.count(&stored(5)).await, 0);

    // Fixed, the same file goes on where it stopped.
    std::fs::write(&path, csv.replace(",-5,", ",400,")).unwrap();
    let out = import(&app, &path, &["--batch-size", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("5 rows read: 3 new, 2 already present"),
        "{}",
        text(&out)
    );
}

async fn json_lines_carry_typed_attributes_and_other_data_is_reported(app: TestApp) {
    let p = unique("IJ");
    let lines = format!(
        "{{\"id\": \"{p}-1\", \"name\": \"Lot 1\", \"attributes\": {{\"year\": 1998, \"code\": \"1998\"}}}}\n\
         \n\
         {{\"id\": \"{p}-2\", \"name\": \"Lot 2\", \"price\": {{\"amount\": 999, \"currency\": \"EUR\"}}}}\n"
    );
    let path = file("lots.jsonl", &lines);
    let out = import(&app, &path, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let one = app.get_json(&format!("/v1/assets/{p}-1")).await;
    assert_eq!(one["attributes"]["year"], 1998);
    assert_eq!(one["attributes"]["code"], "1998");

    // The same ids with other data are left as they are, and named.
    std::fs::write(&path, lines.replace("Lot 2", "Lot two")).unwrap();
    let out = import(&app, &path, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.contains("1 present with other data"), "{said}");
    assert!(said.contains(&format!("{p}-2")), "{said}");
    let two = app.get_json(&format!("/v1/assets/{p}-2")).await;
    assert_eq!(two["name"], "Lot 2");

    // A line that is no asset: its line number and what is wrong.
    let bad = file(
        "bad.jsonl",
        &format!("{{\"id\": \"{p}-9\", \"nme\": \"x\"}}\n"),
    );
    let out = import(&app, &bad, &[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("line 1: not an asset"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("nothing was written"), "{}", text(&out));
}

async fn a_file_the_import_cannot_read_says_why(app: TestApp) {
    let unknown = file("plates.txt", "id,name\nX,Y\n");
    let out = import(&app, &unknown, &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--format csv"), "{}", text(&out));
    let header = file("plates.csv", "id,title\nX,Y\n");
    let out = import(&app, &header, &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("column \"title\""), "{}", text(&out));
    let missing = file("plates.csv", "id,name,price_amount\nX1,Y,100\n");
    let out = import(&app, &missing, &[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("give both, or neither"),
        "{}",
        text(&out)
    );
}

backend_tests!(
    a_csv_catalogue_is_readable_filterable_and_a_rerun_changes_nothing,
    a_bad_row_stops_its_batch_and_names_its_line,
    json_lines_carry_typed_attributes_and_other_data_is_reported,
    a_file_the_import_cannot_read_says_why,
);
