"""Docs a user can follow alone: the README, the documents in ``docs/`` it
links to and every ``--help`` stand on their own (no references to documents a user does not
have, no raw markup, no link to a file or heading that is not there), the README's commands
table is short and names every command, the help explains the option values,
``compile --help`` shows the request format, and the man pages generated from the help are
current and installed with the package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cachemgr.cli import COMMANDS
from tests.conftest import ROOT, run_cli
from tests.xdist_util import shared_once

README = (ROOT / "README.md").read_text()
#: The detailed documents the README links to (moved out of it), ``security.md`` included: its
#: sections refer to each other and to the other documents, not to issues a reader lacks.
DOCS = {p.name: p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}


def _all_help() -> dict[str, str]:
    names = [[]] + [[n] for n in COMMANDS] + [["limits", "set"], ["limits", "show"]]
    helps = {}
    for name in names:
        proc = run_cli(*name, "--help")
        assert proc.returncode == 0, (name, proc.stderr)
        helps[" ".join(name) or "cachemgr"] = proc.stdout
    return helps


@pytest.fixture(scope="module")
def helps(request: pytest.FixtureRequest) -> dict[str, str]:
    """Every ``--help`` text, made once per run (some 30 CLI runs): the suite's xdist workers
    share them through a file in the run's shared folder."""
    return shared_once(request.config, "help-texts", _all_help)


def test_readme_and_help_refer_to_nothing_a_user_lacks(helps: dict[str, str]) -> None:
    docs = {f"docs/{name}": text for name, text in DOCS.items()}
    unit = {"the systemd unit": (ROOT / "systemd" / "cachemgr.service").read_text()}
    assert len(docs) >= 10, sorted(docs)
    for where, text in {"README.md": README, **docs, **helps, **unit}.items():
        assert not re.search(r"\bSPEC\b|§|\.\./shared|STYLE\.md|\bissues? \d", text), where
        assert not re.search(r"\bi1\d\w?\b|\(atk\)|\bitems? \d", text), where
    for command, text in helps.items():
        assert "``" not in text and "`" not in text, f"raw markup in {command} --help"
        assert "\b" not in text, command


def test_help_explains_jit_compile_and_debug_levels(helps: dict[str, str]) -> None:
    text = " ".join(helps["compile"].split())
    jit = text.split("--jit-compile auto|true|false")[1].split("--op-debug-level")[0]
    for needle in ("auto (default)", "dynamic", "true: always compile", "false: a precompiled"):
        assert needle in jit, needle
    level = text.split("--op-debug-level 0..4")[1].split("--op-debug-config")[0]
    for needle in ("0 (default): no debug", "1:", "2: as 1, plus -O0 -g", "3:", "4:", "bypasses"):
        assert needle in level, needle


def test_compile_help_shows_the_request_format_and_schema(helps: dict[str, str]) -> None:
    text = helps["compile"]
    for field in ("op_type", "soc_version", "language", "kernel_source", "kernel_entry",
                  "inputs", "outputs", "shape", "dtype", "format", "options"):  # fmt: skip
        assert f'"{field}"' in text, field
    schema = re.search(r"Schema: (\S+)", text)
    assert schema and Path(schema.group(1)).is_file(), text


def test_readme_says_how_to_put_cachemgr_on_path() -> None:
    after_demo = README.split("scripts/demo", 1)[1].split("\n## ")[0]
    assert "source .venv/bin/activate" in after_demo and "pip install ." in after_demo


def test_man_pages_are_current(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "manpages.py"), str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.1")}
    shipped = {p.name: p.read_text() for p in (ROOT / "man" / "man1").glob("*.1")}
    assert set(fresh) == set(shipped) and "cachemgr.1" in fresh
    stale = [name for name in fresh if fresh[name] != shipped[name]]
    assert not stale, f"run scripts/manpages.py: {stale} differ from the help"
    assert "limits set" in shipped["cachemgr-limits-set.1"]


def test_help_and_man_pages_summarise_each_command_in_a_whole_phrase() -> None:
    """``cachemgr --help`` cut summaries mid-sentence (``config  Show every setting of every
    table, its value and where it...``), so did the man pages' NAME lines, and cachemgr(1)'s
    read ``cachemgr - cachemgr: the kernel compile cache manager...``."""
    proc = run_cli("--help", env={**os.environ, "COLUMNS": "80"})
    rows = proc.stdout.split("Commands:\n", 1)[1].splitlines()
    assert len(rows) == 15 and not [r for r in rows if r.endswith("...")], rows
    names = {}
    for page in (ROOT / "man" / "man1").glob("*.1"):
        lines = page.read_text().splitlines()
        names[page.name] = lines[lines.index(".SH NAME") + 1]
    assert not [n for n in names.values() if n.endswith("...")], names
    assert names["cachemgr.1"] == (
        "cachemgr \\- the kernel compile cache manager for Ascend CANN build hosts"
    )


def test_pip_install_installs_the_man_pages(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("cachemgr-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    pages = {n.rsplit("/", 1)[1] for n in names if "/data/share/man/man1/" in n}
    assert pages == {p.name for p in (ROOT / "man" / "man1").glob("*.1")}
    assert "cachemgr/schemas/compile_request.schema.json" in names


def test_config_help_and_readme_name_every_table_config_prints(
    helps: dict[str, str], tmp_path: Path
) -> None:
    """Each table ``cachemgr config`` prints (``remote.*`` too) is named in ``config --help``,
    in the README's commands row of ``config`` and in its entry in ``docs/commands.md``."""
    proc = run_cli("config", "--json", "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    shown = proc.stdout
    tables = [t for t in ("daemon", "sandbox", "compilers", "precompiled", "toolkit", "remote")
              if f'"{t}.' in shown]  # fmt: skip
    assert "remote" in tables, shown[:400]
    text = " ".join(helps["config"].split())
    listed = re.search(r"each table of the config file \(([^)]*)\)", text)
    assert listed, text
    row = next(line for line in README.splitlines() if line.startswith("| `cachemgr config"))
    full = DOCS["commands.md"].split("### `cachemgr config", 1)[1].split("\n#", 1)[0]
    for table in tables:
        assert f"[{table}]" in listed.group(1), (table, helps["config"])
        assert f"`{table}.*`" in row, (table, row)
        assert f"`{table}.*`" in full, (table, full)


def test_readme_request_example_compiles_with_flags_and_include_dirs_at_the_top(
    tmp_path: Path,
) -> None:
    """The README said nothing of where ``include_dirs`` and ``extra_flags`` go; a user who
    put them under ``options`` got 'unknown field … in options'. The README's request
    example has them at the top level, compiles as it is (the schema is the truth), and the
    error for one put under ``options`` says where it goes."""
    section = README.split("## The compile request", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block, "no request example in the README's section on the compile request"
    request = json.loads(block.group(1))
    assert {"include_dirs", "extra_flags", "options"} <= set(request)
    assert not {"include_dirs", "extra_flags"} & set(request["options"])
    shutil.copy(ROOT / "examples" / "kernels" / "c" / "add.c", tmp_path / request["kernel_source"])
    for folder in request["include_dirs"]:
        (tmp_path / folder).mkdir()
    (tmp_path / "req.json").write_text(block.group(1))
    cache = str(tmp_path / "cache")
    proc = run_cli("compile", "--local", "--json", "--cache-dir", cache, "req.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "compiled", proc.stdout

    request["options"]["extra_flags"] = request.pop("extra_flags")
    (tmp_path / "bad.json").write_text(json.dumps(request))
    proc = run_cli("compile", "--local", "--cache-dir", cache, "bad.json", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "'extra_flags' in options: extra_flags goes at the top level" in proc.stderr


def test_readme_commands_table_is_one_line_per_command_and_each_is_documented_in_full() -> None:
    """The README's commands table had whole paragraphs in its cells; it now gives each
    command of the CLI a short row, and ``docs/commands.md`` has each one in full."""
    table = README.split("## Commands", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `cachemgr ")]
    assert rows and all(len(row) <= 200 for row in rows), [r for r in rows if len(r) > 200]
    for name in COMMANDS:
        assert any(f"`cachemgr {name}" in row for row in rows), name
        assert f"`cachemgr {name}" in DOCS["commands.md"], name
    assert len(README.splitlines()) < 350


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub makes for a document's headings (lower case, punctuation dropped,
    spaces as hyphens)."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_in_the_readme_and_docs_lead_somewhere() -> None:
    """Material moved from the README into ``docs/``: every relative link of the README and
    of those documents names a file that exists and, after ``#``, a heading it has."""
    texts = {ROOT / "README.md": README} | {ROOT / "docs" / n: t for n, t in DOCS.items()}
    for path, text in texts.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            name, _, anchor = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            assert dest.is_file(), (path.name, target)
            if anchor:
                assert anchor in _anchors(dest.read_text()), (path.name, target)


#: A reference a reader of the repository cannot follow: a numbered section of ``SPEC``, a
#: contract document that is not in it (with or without the word; an RFC's section is fine),
#: or an issue of a tracker it does not have by its number ("issues" in a sentence is fine).
OUTSIDE_REFERENCE = re.compile(r"\bSPEC\b\s*§|(?<!RFC \d{4} )§\s?\d|\bissues? \d+", re.I)
#: ``docs/<name>.md`` or ``docs/<name>.md#<anchor>``, and the ``, #anchor`` that continue it.
DOCS_CITATION = re.compile(r"(?<![\w/.])docs/([\w.-]+\.md)(?:#([\w-]+)((?:,\s*#[\w-]+)*))?")


def _tracked_texts() -> dict[str, str]:
    """Every file git tracks, by its path in the repository, that is text."""
    names = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    texts = {}
    for name in filter(None, names):
        path = ROOT / name
        if path.is_file() and not path.is_symlink():
            try:
                texts[name] = path.read_text()
            except UnicodeDecodeError:
                continue
    return texts


@pytest.fixture(scope="module")
def tracked() -> dict[str, str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return _tracked_texts()


def test_no_tracked_file_cites_a_document_outside_the_repo(tracked: dict[str, str]) -> None:
    """Code, config comments, tests, the request schema and the docs cited sections of
    ``SPEC`` (a contract that is not in the repository) and the items of numbered issues
    (history, which is in git); a new maintainer could follow neither. Every rule is stated
    in the sentence or cited as a section of ``docs/`` (docs/design.md#the-contract) or of
    CANN GE's source."""
    assert len(tracked) > 200, len(tracked)
    found = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for name, text in tracked.items()
        for m in OUTSIDE_REFERENCE.finditer(text)
    ]
    assert not found, f"{len(found)} references outside the repo:\n" + "\n".join(found[:50])


def test_docs_cited_in_code_and_config_have_the_heading_they_name(
    tracked: dict[str, str],
) -> None:
    """Each ``docs/<name>.md#<anchor>`` in code, tests, config, the schemas and BENCHMARKS.md names
    a document that exists and a heading it has (the anchors GitHub makes), as the links of
    the README and the docs do (:func:`test_links_in_the_readme_and_docs_lead_somewhere`)."""
    anchors = {name: _anchors(text) for name, text in DOCS.items()}
    cited, broken = 0, []
    for where, text in tracked.items():
        if (where.startswith("docs/") and where.endswith(".md")) or where == "README.md":
            continue  # relative links there: the test above
        for m in DOCS_CITATION.finditer(text):
            doc, first, more = m.group(1), m.group(2), m.group(3) or ""
            line = text.count("\n", 0, m.start()) + 1
            if doc not in anchors:
                broken.append(f"{where}:{line}: docs/{doc} does not exist")
                continue
            for anchor in ([first] if first else []) + re.findall(r"#([\w-]+)", more):
                cited += 1
                if anchor not in anchors[doc]:
                    broken.append(f"{where}:{line}: docs/{doc}#{anchor} is no heading there")
    assert cited > 200, cited
    assert not broken, "\n".join(broken)


def test_readme_says_what_limits_set_does_without_an_ini(
    clean_env: dict[str, str], tmp_path: Path
) -> None:
    """The README warned of nothing: ``limits set`` on a cache with entries and no
    ``op_cache.ini`` writes nothing (GE purges such a cache at its next start), and the
    ``gc`` it asks for purges every entry. What the README says is what the CLI does."""
    import time

    from tests.test_eviction import kernels, make_entry
    from tests.test_versions import toolkit_env

    section = README.split("**Keep it in bounds.**", 1)[1].split("```", 1)[0]
    said = " ".join(section.split())
    assert "holds entries but no `op_cache.ini`" in said, said
    assert "`limits set` writes nothing and exits 1" in said, said
    assert "`cachemgr gc` purges them now" in said, said
    env = {**clean_env, **toolkit_env(tmp_path, "8.0.RC1", "8.0.RC1")}
    root = tmp_path / "root"
    chip = root / "kernel_cache" / "Ascend910B1"
    make_entry(chip, "te_add_1", 4096, time.time())
    refused = run_cli("limits", "set", "--max-size", "100", "--cache-dir", str(root), env=env)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "1 entry here" in lines[0] and "purges them now" in lines[0]
    assert not (root / "kernel_cache" / "op_cache.ini").exists() and kernels(chip)
    gc = run_cli("gc", "--cache-dir", str(root), env=env)
    assert gc.returncode == 0 and not kernels(chip), (gc.stdout, gc.stderr)
    done = run_cli("limits", "set", "--max-size", "100", "--cache-dir", str(root), env=env)
    assert done.returncode == 0, done.stderr
    assert "max_op_cache_size=100" in (root / "kernel_cache" / "op_cache.ini").read_text()
