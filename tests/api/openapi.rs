//! The OpenAPI document is a contract: the committed file, the binary's
//! output and what the service serves are the same document.

use crate::backend_tests;
use crate::helpers::TestApp;

const REGENERATE: &str = "cargo run -q -- openapi > openapi/holdfast.json";

fn committed() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/holdfast.json"
    ))
    .expect("openapi/holdfast.json is committed")
}

#[test]
fn the_committed_document_is_current() {
    let current = holdfast::http::openapi().to_pretty_json().unwrap();
    assert!(
        committed().trim_end() == current.trim_end(),
        "openapi/holdfast.json is stale; regenerate it with `{REGENERATE}`"
    );
}

#[test]
fn the_binary_prints_the_committed_document() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .arg("openapi")
        .env("HOLDFAST_DATABASE_URL", "sqlite://unused.db")
        .output()
        .expect("holdfast openapi runs");
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim_end(),
        committed().trim_end()
    );
}

#[test]
fn every_operation_is_named_verb_noun_and_tagged() {
    let doc: serde_json::Value = serde_json::from_str(&committed()).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["info"]["version"].is_string());
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default();
            assert!(
                id.contains('_') && id.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{method} {path}: operationId {id:?}"
            );
            assert!(
                op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                "{method} {path}: no tag"
            );
        }
    }
}

/// The guard refuses an HTML form's encodings on every change, whatever its
/// body: every POST and PATCH documents that 415.
#[test]
fn every_change_documents_the_415_of_form_posts() {
    let doc: serde_json::Value = serde_json::from_str(&committed()).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["post", "patch"] {
            if let Some(op) = item.get(method) {
                assert!(
                    op["responses"].get("415").is_some(),
                    "{method} {path} lacks its 415"
                );
            }
        }
    }
}

/// What the client generators need (ci/clients): no `allOf`; every union
/// of objects discriminated by a property each member fixes to its own
/// value; a request body's schema named `…Request`, never the name a
/// generator gives an operation's body (orval: `CompleteRefundBody`).
#[test]
fn every_union_is_discriminated_and_no_schema_is_composed() {
    let doc: serde_json::Value = serde_json::from_str(&committed()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let text = committed();
    assert!(!text.contains("\"allOf\""), "the document uses allOf");
    let mut unions = Vec::new();
    find_unions(&doc, &mut unions);
    let mut discriminated = 0;
    for union in unions {
        let members = union["oneOf"].as_array().unwrap();
        let refs: Vec<&str> = members.iter().filter_map(|m| m["$ref"].as_str()).collect();
        if refs.len() < 2 {
            // A nullable value (`oneOf [null, T]`) or one of several JSON
            // types (an attribute): nothing to discriminate.
            assert!(
                members.iter().all(|m| m.get("properties").is_none()),
                "{union}"
            );
            continue;
        }
        let property = union["discriminator"]["propertyName"]
            .as_str()
            .unwrap_or_else(|| panic!("a union without a discriminator: {union}"));
        let mapping = union["discriminator"]["mapping"].as_object().unwrap();
        assert_eq!(mapping.len(), refs.len(), "{union}");
        for (value, target) in mapping {
            let name = target.as_str().unwrap().rsplit('/').next().unwrap();
            assert!(refs.contains(&target.as_str().unwrap()), "{union}");
            let member = &schemas[name];
            assert_eq!(
                member["properties"][property]["enum"],
                serde_json::json!([value]),
                "{name} does not fix {property} to {value}"
            );
            assert!(
                member["required"]
                    .as_array()
                    .unwrap()
                    .contains(&serde_json::json!(property)),
                "{name} does not require {property}"
            );
        }
        discriminated += 1;
    }
    // The event feed and every status with several error codes.
    assert!(discriminated >= 8, "{discriminated} discriminated unions");
    for name in schemas.as_object().unwrap().keys() {
        assert!(!name.ends_with("Body"), "{name}: call it {name}Request");
    }
}

fn find_unions<'a>(value: &'a serde_json::Value, found: &mut Vec<&'a serde_json::Value>) {
    match value {
        serde_json::Value::Object(map) => {
            if map.contains_key("oneOf") {
                found.push(value);
            }
            map.values().for_each(|v| find_unions(v, found));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| find_unions(v, found)),
        _ => {}
    }
}

async fn the_service_serves_the_committed_document(app: TestApp) {
    let served = app.get("/openapi.json").await.text().await.unwrap();
    assert_eq!(served.trim_end(), committed().trim_end());
    let docs = app.client.get(app.url("/docs")).send().await.unwrap();
    assert_eq!(docs.status(), 200, "/docs redirects to the page");
    assert!(docs.url().path().ends_with("/docs/"));
    let page = docs.text().await.unwrap();
    assert!(page.contains("swagger-ui"));
    let init = app
        .get("/docs/swagger-initializer.js")
        .await
        .text()
        .await
        .unwrap();
    assert!(init.contains("\"validatorUrl\": \"none\""), "{init}");
    assert!(init.contains("/openapi.json"));
}

backend_tests!(the_service_serves_the_committed_document);
