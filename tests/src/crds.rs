//! Custom resources and Grafana dashboards checked against the schemas their
//! projects publish, vendored under `tests/fixtures/crds` (sources, commits
//! and licences in its README): each object against the `openAPIV3Schema` of
//! the served version of its kind's CRD, read as the API server reads it
//! (unknown fields refused, as with strict field validation); a dashboard
//! against Grafana's dashboard JSON Schema. PyPI's `jsonschema` in the venv
//! does the validating (`crds.py` beside this file says how the OpenAPI
//! dialect and Kubernetes' extensions become Draft 7). A kind with no
//! vendored CRD is a violation, never a pass.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helm::{python, succeed};
use crate::workspace;

/// The checker, run by the venv's Python.
const CHECKER: &str = include_str!("crds.py");

/// Where the vendored CRDs and schemas live.
pub fn fixtures() -> PathBuf {
    workspace().join("tests/fixtures/crds")
}

/// Grafana's dashboard JSON Schema (draft-07), from grafana-foundation-sdk.
pub fn dashboard_schema() -> PathBuf {
    fixtures().join("grafana-foundation-sdk/dashboard.jsonschema.json")
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Findings {
    /// One line per violation: `KIND NAME: $.path.in[0].object: what is wrong`.
    pub violations: Vec<String>,
    /// The CEL rules (`x-kubernetes-validations`) of the schemas used, which
    /// the checker cannot evaluate: where each is, the rule and its message.
    pub unevaluated: Vec<String>,
}

/// Runs the checker in `mode` over `instances` (written to `dir`) against `schemas`.
async fn check(mode: &str, schemas: &Path, instances: &Value, dir: &Path) -> Findings {
    let file = dir.join(format!("{mode}-to-check.json"));
    std::fs::write(&file, serde_json::to_vec(instances).unwrap()).unwrap();
    let checker = dir.join("crds.py");
    std::fs::write(&checker, CHECKER).unwrap();
    let mut command = python();
    command.arg(&checker).arg(mode).arg(schemas).arg(&file);
    let out = succeed(&format!("schema check ({mode})"), command, dir).await;
    let found: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("the schema check printed no JSON ({e}):\n{out}"));
    let lines = |key: &str| -> Vec<String> {
        found[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|line| line.as_str().unwrap().to_owned())
            .collect()
    };
    Findings {
        violations: lines("violations"),
        unevaluated: lines("unevaluated"),
    }
}

/// Checks each object against the CRD of its `apiVersion` and `kind`
/// (the version it names, which the CRD must serve), of any kind vendored.
pub async fn check_objects(objects: &[&Value], dir: &Path) -> Findings {
    let list = Value::Array(objects.iter().map(|o| (*o).clone()).collect());
    check("objects", &fixtures(), &list, dir).await
}

/// [`check_objects`], failing the test with every violation's object and path; prints the CEL
/// rules it could not evaluate.
pub async fn validate(objects: &[&Value], dir: &Path) {
    let findings = check_objects(objects, dir).await;
    for rule in &findings.unevaluated {
        println!("not evaluated (CEL): {rule}");
    }
    assert!(
        findings.violations.is_empty(),
        "{} object(s) break their CRD's schema:\n{}",
        objects.len(),
        findings.violations.join("\n")
    );
}

/// Checks a Grafana dashboard (its JSON model) against Grafana's dashboard schema.
pub async fn check_dashboard(dashboard: &Value, dir: &Path) -> Findings {
    check("document", &dashboard_schema(), dashboard, dir).await
}

/// [`check_dashboard`], failing the test with the path of every violation.
pub async fn validate_dashboard(dashboard: &Value, dir: &Path) {
    let findings = check_dashboard(dashboard, dir).await;
    assert!(
        findings.violations.is_empty(),
        "the dashboard breaks Grafana's schema:\n{}",
        findings.violations.join("\n")
    );
}
