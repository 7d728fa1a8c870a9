"""MkDocs hook: the parts of the documentation that the code says, generated at build time.

A page asks for a part with a marker line, which this hook replaces:

* ``<!-- generated: openapi -->``: the HTTP API reference, from the FastAPI app's own
  OpenAPI schema (``server.api.app.create_app(...).openapi()``), also served as
  ``openapi.json`` beside the site;
* ``<!-- generated: settings -->``: the configuration table, from ``server.settings.Settings``
  (each field's environment variable, default and help text);
* ``<!-- generated: metrics -->``: the Prometheus metrics, read from the calls that define
  them in ``server/`` (``Counter("strata_...", "help", [labels])`` and the like).

It also adds ``bench/results/summary.png`` (the benchmarks' chart, written by ``make bench``)
to the site as ``bench-summary.png``. Nothing here is copied by hand, so the pages cannot
drift from the code.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- generated: {} -->"
METRIC_CLASSES = {
    "Counter": "counter",
    "Gauge": "gauge",
    "Histogram": "histogram",
    "GaugeMetricFamily": "gauge",
    "CounterMetricFamily": "counter",
}


def openapi_schema() -> dict[str, Any]:
    """The schema `GET /openapi.json` serves, from an app built with default settings.
    Building the app touches no database: the routes only use the service when called."""
    from server.api.app import create_app
    from server.settings import Settings

    service = SimpleNamespace(metrics=None)
    return create_app(service, Settings(), {}).openapi()  # type: ignore[arg-type]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_type(option) for option in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_type(schema.get('items', {}))}"
    return str(schema.get("type", "any"))


def openapi_markdown(schema: dict[str, Any]) -> str:
    lines: list[str] = []
    scheme = schema.get("components", {}).get("securitySchemes", {})
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            lines += [f"### {method.upper()} `{path}`", ""]
            if operation.get("summary"):
                lines += [f"**{operation['summary']}.**", ""]
            if operation.get("description"):
                lines += [operation["description"].strip(), ""]
            if operation.get("security") and scheme:
                lines += ["Needs a bearer token once tokens are configured.", ""]
            parameters = operation.get("parameters", [])
            if parameters:
                lines += ["| parameter | in | type | required | default |", "|---|---|---|---|---|"]
                for parameter in parameters:
                    param_schema = parameter.get("schema", {})
                    default = param_schema.get("default", "")
                    lines.append(
                        f"| `{parameter['name']}` | {parameter['in']} | {_type(param_schema)} "
                        f"| {'yes' if parameter.get('required') else 'no'} "
                        f"| {'' if default == '' else f'`{json.dumps(default)}`'} |"
                    )
                lines.append("")
            body = operation.get("requestBody")
            if body:
                kinds = ", ".join(
                    f"`{kind}` ({_type(content.get('schema', {}))})"
                    for kind, content in body.get("content", {}).items()
                )
                lines += [f"Request body: {kinds}.", ""]
            responses = operation.get("responses", {})
            if responses:
                lines += ["| status | response |", "|---|---|"]
                for status, response in responses.items():
                    lines.append(f"| {status} | {_cell(response.get('description', ''))} |")
                lines.append("")
    schemas = schema.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["### Schemas", ""]
        for name, body in schemas.items():
            lines += [f"**`{name}`**", ""]
            properties = body.get("properties", {})
            required = set(body.get("required", []))
            if properties:
                lines += ["| field | type | required |", "|---|---|---|"]
                for field, field_schema in properties.items():
                    lines.append(
                        f"| `{field}` | {_cell(_type(field_schema))} "
                        f"| {'yes' if field in required else 'no'} |"
                    )
                lines.append("")
    return "\n".join(lines)


def settings_markdown() -> str:
    from server.settings import Settings

    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if default is None:
            shown = "unset"
        elif isinstance(default, tuple):
            shown = f"`{','.join(map(str, default))}`"
        else:
            shown = f"`{default}`"
        lines.append(f"| `STRATA_{name.upper()}` | {shown} | {_cell(field.description or '')} |")
    return "\n".join(lines)


def _literal_strings(node: ast.AST | None) -> list[str] | None:
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(item, ast.Constant) and isinstance(item.value, str) for item in node.elts
    ):
        return [item.value for item in node.elts]  # type: ignore[attr-defined]
    return None


def metrics() -> list[dict[str, Any]]:
    """Every metric the server defines: name as exposed, type, labels, help, module."""
    found = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            kind = METRIC_CLASSES.get(getattr(node.func, "id", getattr(node.func, "attr", "")))
            args = node.args
            if kind is None or len(args) < 2:
                continue
            name, text = args[0], args[1]
            if not (isinstance(name, ast.Constant) and str(name.value).startswith("strata_")):
                continue
            if not isinstance(text, ast.Constant):
                continue
            labels = _literal_strings(args[2]) if len(args) > 2 else None
            for keyword in node.keywords:
                if keyword.arg in ("labels", "labelnames"):
                    labels = _literal_strings(keyword.value)
            exposed = f"{name.value!s}_total" if kind == "counter" else str(name.value)
            found.append(
                {
                    "name": exposed,
                    "type": kind,
                    "labels": labels or [],
                    "help": str(text.value),
                    "module": str(path.relative_to(ROOT)),
                }
            )
    return found


def metrics_markdown() -> str:
    lines = ["| metric | type | labels | what | defined in |", "|---|---|---|---|---|"]
    for metric in metrics():
        labels = ", ".join(f"`{label}`" for label in metric["labels"])
        lines.append(
            f"| `{metric['name']}` | {metric['type']} | {labels} | {_cell(metric['help'])} "
            f"| `{metric['module']}` |"
        )
    return "\n".join(lines)


GENERATORS = {
    "openapi": lambda: openapi_markdown(openapi_schema()),
    "settings": settings_markdown,
    "metrics": metrics_markdown,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    chart = ROOT / "bench" / "results" / "summary.png"
    files.append(File.generated(config, "bench-summary.png", abs_src_path=str(chart)))
    files.append(
        File.generated(config, "openapi.json", content=json.dumps(openapi_schema(), indent=2))
    )
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    for name, generate in GENERATORS.items():
        marker = MARKER.format(name)
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown
