"""Validates objects against published schemas, for tests/src/crds.rs.

    crds.py objects CRD_DIR OBJECTS.json   each object against the CRD of its apiVersion and kind
    crds.py document SCHEMA.json DOC.json  one document against a JSON Schema (Grafana's dashboard)

Prints {"violations": [...], "unevaluated": [...]} as JSON: a line per violation, naming the object
and the path in it, and the CEL rules (x-kubernetes-validations) of the schemas used, which no
Python library here evaluates.

A CRD's openAPIV3Schema is OpenAPI 3.0's subset with Kubernetes' extensions; it becomes Draft 7 as
the API server reads it: `nullable` admits null; boolean exclusiveMinimum/Maximum become numbers;
x-kubernetes-int-or-string admits an integer or a string; an object without
x-kubernetes-preserve-unknown-fields admits only the properties it lists (the server's strict field
validation, as kubectl asks for it); x-kubernetes-embedded-resource admits apiVersion, kind and
metadata; x-kubernetes-list-type set or map refuses duplicates (a map's items by their
x-kubernetes-list-map-keys, which each item must hold); metadata is checked as the server checks
ObjectMeta's name, labels and annotations; formats int32, int64 and date-time are checked.
x-kubernetes-map-type only sets how a field merges and needs no check.
"""

import json
import pathlib
import re
import sys

import jsonschema
import yaml

DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_NAME = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")

OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": DNS_SUBDOMAIN},
        "namespace": {"type": "string", "maxLength": 63, "pattern": DNS_SUBDOMAIN},
        "labels": {
            "type": "object",
            "propertyNames": {"maxLength": 316, "pattern": LABEL_NAME},
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        },
        "annotations": {
            "type": "object",
            "propertyNames": {"maxLength": 316, "pattern": LABEL_NAME},
            "additionalProperties": {"type": "string"},
        },
    },
}

SUBSCHEMAS = ("items", "not", "additionalProperties")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def draft7(node, where, unevaluated):
    """The Draft 7 form of one OpenAPI v3 schema node (and of the nodes under it)."""
    out = dict(node)
    for key in SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = draft7(out[key], f"{where}.{key}", unevaluated)
    for key in SCHEMA_LISTS:
        if key in out:
            out[key] = [draft7(s, f"{where}.{key}", unevaluated) for s in out[key]]
    if "properties" in out:
        out["properties"] = {
            name: draft7(s, f"{where}.{name}", unevaluated) for name, s in out["properties"].items()
        }
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool) and out.pop(bound) and limit in out:
            out[bound] = out.pop(limit)
    is_object = out.get("type") == "object" or "properties" in out
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", OBJECT_META)
    if (
        is_object
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    for rule in out.get("x-kubernetes-validations", []):
        unevaluated.append(f"{where}: {rule.get('rule')} ({rule.get('message', 'no message')})")
    return out


def list_type(validator, kind, instance, schema):
    """x-kubernetes-list-type: a set's items, or a map's keys, appear once each."""
    if not validator.is_type(instance, "array") or kind not in ("set", "map"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen = set()
    for index, item in enumerate(instance):
        if kind == "map":
            missing = [k for k in keys if not isinstance(item, dict) or k not in item]
            if missing:
                yield jsonschema.ValidationError(f"item {index} lacks the map keys {missing}")
                continue
            identity = json.dumps([item[k] for k in keys])
        else:
            identity = json.dumps(item, sort_keys=True)
        if identity in seen:
            yield jsonschema.ValidationError(f"item {index} repeats {identity} in a list-type {kind}")
        seen.add(identity)


def format_checker():
    checker = jsonschema.FormatChecker(formats=())

    def integer_within(bits):
        return lambda value: not isinstance(value, int) or -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)

    checker.checks("int32")(integer_within(32))
    checker.checks("int64")(integer_within(64))
    checker.checks("date-time")(lambda value: not isinstance(value, str) or bool(RFC3339.match(value)))
    return checker


KubernetesValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-type": list_type}
)


def where(path):
    """A JSON path: $.spec.endpoints[0].port."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def causes(error):
    """The errors that explain `error`: for anyOf and oneOf, those of the branch that came closest
    (the fewest errors, then the deepest)."""
    if not error.context:
        return [error]
    branches = {}
    for inner in error.context:
        branches.setdefault(inner.relative_schema_path[0], []).append(inner)
    closest = min(
        branches.values(),
        key=lambda errors: (len(errors), -max(len(e.absolute_path) for e in errors)),
    )
    return [cause for inner in closest for cause in causes(inner)]


def describe(error):
    """A line per cause of `error`: its path in the instance, and what is wrong there."""
    lines = []
    for cause in causes(error):
        message = cause.message if len(cause.message) <= 300 else cause.message[:300] + "…"
        lines.append(f"{where(cause.absolute_path)}: {message}")
    return lines


def crds(directory):
    """Every CustomResourceDefinition under `directory`, by (group, kind)."""
    found = {}
    for path in sorted(pathlib.Path(directory).rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "CustomResourceDefinition":
                spec = document["spec"]
                found[(spec["group"], spec["names"]["kind"])] = (path.name, spec)
    return found


def schema_of(definitions, obj, unevaluated):
    """The Draft 7 schema of the served version of obj's kind, or why there is none."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    group, _, version = api_version.rpartition("/")
    if (group, kind) not in definitions:
        return None, f"no CRD of {kind} in group {group!r} is vendored"
    file, spec = definitions[(group, kind)]
    versions = [v for v in spec["versions"] if v["name"] == version]
    if not versions or not versions[0].get("served"):
        served = [v["name"] for v in spec["versions"] if v.get("served")]
        return None, f"{file} serves no version {version!r} (served: {served})"
    schema = draft7(versions[0]["schema"]["openAPIV3Schema"], f"{file} {version}", unevaluated)
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = OBJECT_META
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
    return schema, None


def check_objects(directory, objects_file):
    definitions = crds(directory)
    violations, unevaluated = [], []
    for obj in json.loads(pathlib.Path(objects_file).read_text()):
        name = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        schema, missing = schema_of(definitions, obj, unevaluated)
        if missing:
            violations.append(f"{name}: {missing}")
            continue
        validator = KubernetesValidator(schema, format_checker=format_checker())
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        violations.extend(f"{name}: {line}" for e in errors for line in describe(e))
    return violations, sorted(set(unevaluated))


def check_document(schema_file, document_file):
    schema = json.loads(pathlib.Path(schema_file).read_text())
    document = json.loads(pathlib.Path(document_file).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    errors = sorted(cls(schema).iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    return [line for e in errors for line in describe(e)], []


def main():
    mode, schemas, instances = sys.argv[1:4]
    check = {"objects": check_objects, "document": check_document}[mode]
    violations, unevaluated = check(schemas, instances)
    json.dump({"violations": violations, "unevaluated": unevaluated}, sys.stdout)


main()
