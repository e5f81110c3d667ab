"""What the repository promises a newcomer holds: a license, a citation file valid against the
Citation File Format's schema, citing the paper it reproduces."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_citation_cff_is_valid_and_cites_the_paper():
    schema = json.loads((ROOT / "tests" / "data" / "cff-1.2.0.schema.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    jsonschema.Draft7Validator(
        schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    ).validate(cff)
    (paper,) = cff["references"]
    assert "arXiv:2512.19428" in [i["value"] for i in paper["identifiers"]]
    assert cff["license"] == "MIT"


def test_a_broken_citation_is_caught():
    schema = json.loads((ROOT / "tests" / "data" / "cff-1.2.0.schema.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    cff["references"][0]["repository"] = "arXiv"  # not a URL
    assert list(jsonschema.Draft7Validator(schema).iter_errors(cff))
    del cff["references"][0]["repository"], cff["authors"]
    assert any("authors" in e.message for e in jsonschema.Draft7Validator(schema).iter_errors(cff))


def test_license_is_mit_as_pyproject_says():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY" in text
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()


# --- the docs hold: commands, links, make targets, config keys, the rule graph -------------------
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from helpers import rule_graph, schema_keys  # noqa: E402

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
BIN = Path(sys.executable).parent


def code_blocks(text: str, lang=r"\w*") -> list[str]:
    return re.findall(rf"(?ms)^```{lang}\n(.*?)^```", text)


def shell_commands(text: str) -> list[str]:
    """The commands of a page's shell code blocks (continuations joined, comments dropped)."""
    out = []
    for block in code_blocks(text, "(?:bash|sh|console)"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def snakemake_commands(text: str) -> list[str]:
    return [c for c in shell_commands(text) if c.startswith("snakemake ")]


# commands that need a finished run or another machine's state to mean anything: not dry-run
NEEDS_RESULTS = ("--report", "--unlock", "--cleanup-metadata")


def dry_run_problems(command: str, cwd: Path) -> list[str]:
    if any(flag in command for flag in NEEDS_RESULTS):
        return []
    from helpers.dag import run_snakemake

    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(cwd / "src"),
    }
    # its words as bash makes them from the pasted line (`$(grassflow gpus)` expands), then dry: -n
    # first
    rest = command[len("snakemake") :]
    words = (
        subprocess.run(
            ["bash", "-c", "printf '%s\\0' " + rest],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout.split("\0")[:-1]
        if rest.strip()
        else []
    )
    res = run_snakemake(["-n", *words], cwd, env, timeout=1200)
    return (
        []
        if res.returncode == 0
        else [f"`{command}` fails to plan: {(res.stderr or res.stdout).strip()[-600:]}"]
    )


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return s.replace(" ", "-")


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    prose = re.sub(r"(?ms)^```.*?^```", "", text)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.name}: link to {target}: no such file")
        elif anchor:
            headings = re.findall(
                r"(?m)^#+ (.+)$", re.sub(r"(?ms)^```.*?^```", "", dest.read_text())
            )
            if anchor not in {slug(h) for h in headings}:
                problems.append(f"{page.name}: link to {target}: no such heading in {dest.name}")
    return problems


def make_targets() -> set[str]:
    return set(re.findall(r"(?m)^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text()))


def make_problems(page: Path, text: str, targets: set[str]) -> list[str]:
    named = re.findall(r"(?:^|`)make ([A-Za-z][\w-]*)", text, re.M)
    named += [
        c.split()[1] for c in shell_commands(text) if c.startswith("make ") and len(c.split()) > 1
    ]
    return [
        f"{page.name}: `make {t}`: no such target" for t in sorted(set(named)) if t not in targets
    ]


PRESET_SECTIONS = (
    "data",
    "tokenizer",
    "models",
    "seeds",
    "model",
    "model_overrides",
    "experiments",
    "train",
    "ablations",
    "bench",
    "snli",
    "recall",
    "estimate",
    "base",
)


FILE_SUFFIX = re.compile(
    r"\.(py|png|json|jsonl|md|csv|tex|yaml|pt|safetensors|tsv|parquet|cu|cpp|h|so|txt|zip|log|smk)$"
)


def _expand(token: str) -> list[str]:
    m = re.search(r"\{([\w,]+)\}", token)
    if m:
        return [x for alt in m.group(1).split(",") for x in _expand(token.replace(m.group(0), alt))]
    return [token.rstrip(".")]


def _pattern(key: str, below: bool = False) -> re.Pattern:
    """A key with placeholders (`<split>`, `<name>`) or `*` segments, as a regex over key paths;
    below: the keys under it match too."""
    parts = ["[^.]+" if p.startswith("<") or p == "*" else re.escape(p) for p in key.split(".")]
    return re.compile(r"\.".join(parts) + (r"(\..+)?" if below else ""))


def key_problems(page: Path, text: str, known: set[str]) -> list[str]:
    """Backticked config keys (`train.threads`, `model.*`,
    `snli.head_overrides.{grassmann,transformer}`, `data.expected_sha256.<split>`) that the schema
    does not have. File names are not keys."""
    problems = []
    for token in re.findall(r"`([a-z_]+(?:\.(?:[a-z_0-9]+|\*|<[a-z_]+>|\{[\w,]+\}))+)`", text):
        if token.split(".")[0] not in PRESET_SECTIONS or FILE_SUFFIX.search(token):
            continue
        for key in _expand(token):
            # a page may name a section: `model_overrides.grassmann`
            pat = _pattern(key, below=True)
            # a schema key spelled with <name> matches any name in the page's key, and vice versa
            if not any(pat.fullmatch(k) or _pattern(k).fullmatch(key) for k in known):
                problems.append(f"{page.name}: `{token}` is no config key")
    return problems


def known_keys() -> set[str]:
    ks = {k.replace("(top level) ", "") for k in schema_keys.keys()}
    # a key under a map read through another definition: model_overrides.grassmann.norm and the like
    for k, node in schema_keys.keys().items():
        if node.get("same_keys_as"):
            base = node["same_keys_as"]
            ks |= {k + sub[len(base) :] for sub in list(ks) if sub.startswith(base + ".")}
    return ks


def test_every_relative_link_and_anchor_resolves():
    problems = [p for page in DOCS for p in link_problems(page, page.read_text())]
    assert not problems, "\n".join(problems)


def test_every_make_target_named_exists():
    targets = make_targets()
    problems = [p for page in DOCS for p in make_problems(page, page.read_text(), targets)]
    assert not problems, "\n".join(problems)


def test_every_config_key_is_on_the_configuration_page_and_no_page_names_another():
    page = ROOT / "docs" / "use" / "configuration.md"
    assert schema_keys.table() in page.read_text(), (
        "docs/use/configuration.md: regenerate: python tests/helpers/schema_keys.py"
    )
    known = known_keys()
    problems = [p for doc in DOCS for p in key_problems(doc, doc.read_text(), known)]
    assert not problems, "\n".join(problems)


def test_the_readme_is_short_and_its_rule_graph_is_todays(tmp_path):
    from helpers.dag import copy_repo

    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 210
    assert "](docs/dag.svg)" in readme
    assert rule_graph.svg_graph(rule_graph.SVG.read_text()) == rule_graph.dot_graph(
        rule_graph.rule_graph_dot(copy_repo(tmp_path))
    ), "docs/dag.svg: redraw it: python tests/helpers/rule_graph.py"


def test_the_graph_comparison_sees_a_missing_edge_and_rule():
    nodes, edges = rule_graph.svg_graph(rule_graph.SVG.read_text())
    assert len(nodes) > 15 and ("train", "evaluate") in edges and ("summary", "all") in edges
    svg = rule_graph.SVG.read_text()
    first_edge = re.search(r'<g id="edge\d+" class="edge">.*?</g>', svg, re.S).group(0)
    assert rule_graph.svg_graph(svg.replace(first_edge, "", 1))[1] < edges
    dot = '0[label = "all"];\n1[label = "train"];\n1 -> 0\n'
    assert rule_graph.dot_graph(dot) == (frozenset({"all", "train"}), frozenset({("train", "all")}))


@pytest.mark.slow
def test_every_snakemake_command_in_the_docs_plans(tmp_path):
    from helpers.dag import copy_repo

    work = copy_repo(tmp_path)
    commands = sorted({c for page in DOCS for c in snakemake_commands(page.read_text())})
    assert len(commands) >= 5
    problems = [p for c in commands for p in dry_run_problems(c, work)]
    assert not problems, "\n".join(problems)


# --- and each check fails on a broken page -------------------------------------------------------
BROKEN = ROOT / "docs" / "use" / "broken.md"


def test_the_checks_catch_a_broken_page(tmp_path):
    from helpers.dag import copy_repo

    page = (
        "# Broken\n\n[gone](nowhere.md) [bad anchor](configuration.md#no-such-heading) "
        "[ok](configuration.md#every-key)\n\nRun `make no-such-target`, set `train.no_such_key` "
        "and `model_overrides.grassmann.norm`.\n\n```bash\nsnakemake --config "
        "preset=no-such-preset\n```\n"
    )
    assert link_problems(BROKEN, page) == [
        "broken.md: link to nowhere.md: no such file",
        "broken.md: link to configuration.md#no-such-heading: no such heading in configuration.md",
    ]
    assert make_problems(BROKEN, page, make_targets()) == [
        "broken.md: `make no-such-target`: no such target"
    ]
    assert key_problems(BROKEN, page, known_keys()) == [
        "broken.md: `train.no_such_key` is no config key"
    ]
    (cmd,) = snakemake_commands(page)
    assert dry_run_problems(cmd, copy_repo(tmp_path))  # an unknown preset does not plan


@pytest.mark.parametrize(
    "heading, anchor",
    [
        ("Quick start", "quick-start"),
        ("The paper's ambiguities, and our defaults", "the-papers-ambiguities-and-our-defaults"),
        (
            "GPUs: `make gpu-check`, and what is verified where",
            "gpus-make-gpu-check-and-what-is-verified-where",
        ),
    ],
)
def test_anchors_are_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_the_docs_python_snippets_run(tokens, tmp_path, monkeypatch):
    """Every ```python block of the docs and the README runs as written, in a directory holding the
    paths they name (an export and a run directory of a tiny trained model); the hub's upload is a
    stand-in that records its call (no network here)."""
    import re
    import shutil

    from grassflow.export import export_run
    from grassflow.lm.evaluate import evaluate_run
    from grassflow.lm.train import train
    from helpers.specs import LM_SPEC

    run = tmp_path / "results/paper/runs/table1-grassmann-s0"
    train(
        {**LM_SPEC, "train": {**LM_SPEC["train"], "epochs": 1, "max_steps_per_epoch": 2}},
        tokens / "train.parquet",
        tokens / "validation.parquet",
        run,
    )
    evaluate_run(
        run / "model.safetensors",
        run / "run.json",
        tokens / "validation.parquet",
        tokens / "test.parquet",
        run / "eval.json",
    )
    export_run(run, tmp_path / "exports/table1-grassmann-s0", tokenizer=tokens / "tok.json")
    import huggingface_hub

    uploads = []
    monkeypatch.setattr(huggingface_hub, "upload_folder", lambda **kw: uploads.append(kw))
    monkeypatch.chdir(tmp_path)
    snippets = [
        (md.relative_to(ROOT), code)
        for md in DOCS
        for code in re.findall(r"```python\n(.*?)```", md.read_text(), re.S)
    ]
    assert len(snippets) >= 2
    for where, code in snippets:
        try:
            exec(compile(code, str(where), "exec"), {"__name__": "__snippet__"})
        except Exception as e:
            raise AssertionError(
                f"a snippet of {where} fails: {type(e).__name__}: {e}\n{code}"
            ) from e
    assert uploads and all(Path(u["folder_path"]).is_dir() for u in uploads)
    shutil.rmtree(tmp_path / "exports")


def test_the_suite_is_laid_out_like_the_package():
    """tests/ mirrors src/grassflow/ (docs/develop/development.md): every test file in a directory
    named for a part of the package, none at the root, and no test module imports another (what they
    share is in tests/helpers/)."""
    tests = ROOT / "tests"
    parts = {
        "core",
        "ops",
        "models",
        "lm",
        "snli",
        "recall",
        "report",
        "bench",
        "pipeline",
        "gpu",
        "user",
    }
    files = sorted(tests.rglob("test_*.py"))
    assert files and not [f for f in files if f.parent == tests], "a test file at tests/'s root"
    stray = [f for f in files if f.relative_to(tests).parts[0] not in parts]
    assert not stray, f"test files outside {sorted(parts)}: {stray}"
    assert {p for p in parts - {"core", "user", "gpu"}} <= {
        p.name for p in (ROOT / "src/grassflow").iterdir()
    }
    crossed = [
        f
        for f in files + sorted((tests / "helpers").glob("*.py"))
        if re.search(r"(?m)^\s*(from|import) test_\w+", f.read_text())
    ]
    assert not crossed, f"test modules imported as helpers: {crossed}"
