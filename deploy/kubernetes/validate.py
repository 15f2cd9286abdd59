#!/usr/bin/env python3
"""Validate every manifest in deploy/kubernetes offline, without an API server.

Built-in kinds are checked with kubernetes-validate (strict: an unknown field is an error)
against the Kubernetes version given with --kubernetes (default: the newest it ships); the
custom resources (KEDA's ScaledObject and TriggerAuthentication, the Prometheus Operator's
ServiceMonitor) against the schemas in schemas/. Prints every document as one JSON list on
stdout; exits 1 naming the file, the document and the reason when one is invalid.

    pip install kubernetes-validate && python3 deploy/kubernetes/validate.py
"""
import argparse
import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = pathlib.Path(__file__).resolve().parent
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication-keda-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes", default=kubernetes_validate.latest_version())
    args = parser.parse_args()
    documents, failures = [], []
    files = sorted(HERE.glob("*.yaml"))
    if not files:
        print(f"no manifest in {HERE}", file=sys.stderr)
        return 1
    for path in files:
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is None:
                continue
            where = f"{path.name} (document {i + 1}, {doc.get('kind')} {doc.get('metadata', {}).get('name')})"
            custom = CUSTOM.get((doc.get("apiVersion"), doc.get("kind")))
            try:
                if custom:
                    schema = json.loads((HERE / "schemas" / custom).read_text())
                    jsonschema.validate(doc, schema)
                else:
                    kubernetes_validate.validate(doc, args.kubernetes, strict=True)
            except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
                path_in_doc = "/".join(str(p) for p in e.path) or "(top)"
                failures.append(f"{where}: at {path_in_doc}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                failures.append(f"{where}: no schema for this kind: {e}")
            documents.append({"file": path.name, "document": doc})
    for failure in failures:
        print(failure, file=sys.stderr)
    print(json.dumps(documents))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
